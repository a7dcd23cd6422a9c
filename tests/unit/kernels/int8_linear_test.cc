// The int8 linear kernels (int8_linear.h) on every instruction set against exact int64 sums
// over the row-major int8 matrices (int8_reference.h): the int32 sums bit for bit at odd
// shapes and at the extremes of the int32 range, the fp32/bf16 outputs bit for bit against
// the documented epilogue, the fused gate/up against the separate products, batch
// invariance, and the packed layout and VNNI correction as documented.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "int8_reference.h"
#include "kernels/cpu/int8_linear.h"

namespace xds::kernels {
namespace {

std::vector<float> run_linear(const Int8Rows& x, const Int8PanelsRef& w, ThreadPool* pool,
                              int64_t ld) {
  std::vector<float> y(static_cast<size_t>(x.rows * ld), NAN);
  const Int8Output out{y.data(), nullptr, ld};
  if (pool != nullptr) {
    int8_linear(x.ref(), w, out, *pool);
  } else {
    int8_linear_on_thread(x.ref(), w, out);
  }
  return y;
}

void expect_bits(float got, float want, const char* what, int64_t t, int64_t r) {
  ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
      << what << " token " << t << " row " << r << ": " << got << " vs " << want;
}

struct Shape {
  int64_t m, n, k;
};

// m in the GEMV and GEMM ranges (one pass, several passes per k block), n and k off every
// panel and group width, k past one k block (512 columns).
constexpr Shape kOddShapes[] = {
    {1, 33, 129},  {2, 1, 1},     {3, 31, 5},     {7, 64, 256},   {9, 100, 515}, {12, 33, 1027},
    {13, 47, 130}, {17, 33, 129}, {64, 100, 515}, {64, 65, 1031}, {1, 97, 2051}, {3, 200, 600},
};

TEST(Int8Linear, SumsAreExactOnEveryPathAtOddShapes) {
  std::mt19937 rng(1);
  const Int8IsaGuard guard;
  for (const Shape& s : kOddShapes) {
    const Int8Rows x = random_int8_rows(s.m, s.k, rng), w = random_int8_rows(s.n, s.k, rng);
    const std::vector<int64_t> want = reference_sums(x, w);
    const Int8Panels panels = Int8Panels::pack(w.ref());
    for (const Int8Isa isa : available_int8_isas()) {
      set_int8_isa(isa);
      const int64_t ld = s.n + 3;
      std::vector<int32_t> sums(static_cast<size_t>(s.m * ld), 0x5a5a5a5a);
      int8_linear_sums_on_thread(x.ref(), panels.ref(), sums.data(), ld);
      for (int64_t t = 0; t < s.m; ++t) {
        for (int64_t r = 0; r < s.n; ++r)
          ASSERT_EQ(sums[t * ld + r], want[t * s.n + r])
              << int8_isa_name(isa) << " m " << s.m << " n " << s.n << " k " << s.k << " token "
              << t << " row " << r;
        for (int64_t r = s.n; r < ld; ++r) ASSERT_EQ(sums[t * ld + r], 0x5a5a5a5a);
      }
    }
  }
}

TEST(Int8Linear, OutputsMatchTheEpilogueBitForBitOnEveryPathAndThreadCount) {
  std::mt19937 rng(2);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const Int8IsaGuard guard;
  for (const Shape& s : kOddShapes) {
    const Int8Rows x = random_int8_rows(s.m, s.k, rng, -127, 127);
    const Int8Rows w = random_int8_rows(s.n, s.k, rng, -127, 127);
    const std::vector<int64_t> sums = reference_sums(x, w);
    const Int8Panels panels = Int8Panels::pack(w.ref());
    const int64_t ld = s.n + 1;
    for (const Int8Isa isa : available_int8_isas()) {
      set_int8_isa(isa);
      const std::vector<float> on_pool = run_linear(x, panels.ref(), &pool, ld);
      const std::vector<float> alone = run_linear(x, panels.ref(), nullptr, ld);
      std::vector<uint16_t> yb(static_cast<size_t>(s.m * ld), 0);
      int8_linear(x.ref(), panels.ref(), {nullptr, yb.data(), ld}, pool);
      for (int64_t t = 0; t < s.m; ++t) {
        for (int64_t r = 0; r < s.n; ++r) {
          const float want = reference_output(sums[t * s.n + r], w.scale[r], x.scale[t]);
          expect_bits(on_pool[t * ld + r], want, int8_isa_name(isa), t, r);
          expect_bits(alone[t * ld + r], want, int8_isa_name(isa), t, r);
          ASSERT_EQ(yb[t * ld + r], f32_to_bf16(want)) << int8_isa_name(isa) << " bf16 " << t;
        }
        ASSERT_TRUE(std::isnan(on_pool[t * ld + s.n])) << "wrote past the rows";
      }
    }
  }
}

TEST(Int8Linear, ExtremeValuesAtTheLargestK) {
  // k = kInt8MaxCols: |Σ| up to 128 · 128 · k = 2147467264, a hair under 2^31; on the VNNI
  // path every intermediate sum of (x + 128) · w wraps past 2^31 several times.
  const int64_t k = kInt8MaxCols;
  const int8_t x_values[] = {127, -127, -128, 0};
  const int8_t w_values[] = {127, -128, -127, 1};
  Int8Rows x, w;
  x.resize(5, k);
  w.resize(5, k);
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t c = 0; c < k; ++c) x.q[t * k + c] = x_values[t];
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < k; ++c) w.q[r * k + c] = w_values[r];
  for (int64_t c = 0; c < k; ++c) {  // alternating signs: the sums cancel to ±127 · 127
    x.q[4 * k + c] = static_cast<int8_t>(c % 2 == 0 ? 127 : -127);
    w.q[4 * k + c] = static_cast<int8_t>(c % 2 == 0 ? -127 : 127);
  }
  std::fill(x.scale.begin(), x.scale.end(), 1.0f);
  std::fill(w.scale.begin(), w.scale.end(), 1.0f);
  const std::vector<int64_t> want = reference_sums(x, w);
  EXPECT_EQ(want[2 * 5 + 1], int64_t{128} * 128 * k);   // -128 · -128
  EXPECT_EQ(want[0 * 5 + 0], int64_t{127} * 127 * k);   // 127 · 127
  EXPECT_EQ(want[2 * 5 + 0], int64_t{-128} * 127 * k);  // the most negative
  EXPECT_LT(want[2 * 5 + 1], int64_t{1} << 31);
  const Int8Panels panels = Int8Panels::pack(w.ref());
  const Int8IsaGuard guard;
  for (const Int8Isa isa : available_int8_isas()) {
    set_int8_isa(isa);
    std::vector<int32_t> sums(25);
    int8_linear_sums_on_thread(x.ref(), panels.ref(), sums.data(), 5);
    for (int64_t i = 0; i < 25; ++i) EXPECT_EQ(sums[i], want[i]) << int8_isa_name(isa) << " " << i;
  }
}

TEST(Int8Linear, PackedLayoutAndCorrectionAsDocumented) {
  std::mt19937 rng(4);
  const int64_t n = 45, k = 13;  // two pairs (the second 13 rows real), 4 groups (3 columns pad)
  const Int8Rows w = random_int8_rows(n, k, rng);
  const Int8Panels panels = Int8Panels::pack(w.ref());
  const Int8PanelsRef ref = panels.ref();
  ASSERT_EQ(ref.groups(), 4);
  ASSERT_EQ(ref.pairs(), 2);
  ASSERT_EQ(ref.data_bytes(), 2 * 4 * 128);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(ref.data) % 64, 0u);
  for (int64_t q = 0; q < 2; ++q)
    for (int64_t g = 0; g < 4; ++g)
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 16; ++j)
          for (int i = 0; i < 4; ++i) {
            const int64_t r = 32 * q + 16 * h + j, c = 4 * g + i;
            const int8_t want = r < n && c < k ? w.q[r * k + c] : int8_t{0};
            ASSERT_EQ(ref.data[(q * 4 + g) * 128 + 64 * h + 4 * j + i], want) << r << " " << c;
          }
  for (int64_t r = 0; r < ref.stored_rows(); ++r) {
    int64_t sum = 0;
    for (int64_t c = 0; r < n && c < k; ++c) sum += w.q[r * k + c];
    EXPECT_EQ(ref.correction[r], static_cast<int32_t>(-128 * sum)) << r;
    EXPECT_EQ(ref.scale[r], r < n ? w.scale[r] : 0.0f) << r;
  }
}

TEST(Int8Linear, OffsetCorrectionCancelsExactly) {
  // x = 0 everywhere: the VNNI lanes see u8 128 and sum 128 · Σ w, which the correction must
  // remove to the last bit; x = -128 (u8 0) leaves the correction alone: -128 · Σ w.
  std::mt19937 rng(6);
  const int64_t n = 70, k = 999;
  Int8Rows w = random_int8_rows(n, k, rng, 90, 127);      // large positive row sums...
  for (int64_t c = 0; c < k; ++c) w.q[5 * k + c] = -128;  // ...and one most negative row
  Int8Rows x;
  x.resize(2, k);
  std::fill(x.q.begin(), x.q.begin() + k, int8_t{0});
  std::fill(x.q.begin() + k, x.q.end(), int8_t{-128});
  const std::vector<int64_t> want = reference_sums(x, w);
  const Int8Panels panels = Int8Panels::pack(w.ref());
  const Int8IsaGuard guard;
  for (const Int8Isa isa : available_int8_isas()) {
    set_int8_isa(isa);
    std::vector<int32_t> sums(static_cast<size_t>(2 * n));
    int8_linear_sums_on_thread(x.ref(), panels.ref(), sums.data(), n);
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(sums[r], 0) << int8_isa_name(isa) << " row " << r;
      EXPECT_EQ(sums[n + r], want[n + r]) << int8_isa_name(isa) << " row " << r;
    }
  }
}

TEST(Int8Linear, ATokenGivesTheSameBitsAloneAndInABatch) {
  std::mt19937 rng(8);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const int64_t m = 40, n = 130, k = 700;
  const Int8Rows x = random_int8_rows(m, k, rng, -127, 127);
  const Int8Panels panels = Int8Panels::pack(random_int8_rows(n, k, rng).ref());
  const Int8IsaGuard guard;
  std::vector<float> first;
  for (const Int8Isa isa : available_int8_isas()) {
    set_int8_isa(isa);
    const std::vector<float> all = run_linear(x, panels.ref(), &pool, n);
    for (const int64_t t : {int64_t{0}, int64_t{13}, m - 1}) {
      Int8Rows one;
      one.resize(1, k);
      std::copy(x.q.begin() + t * k, x.q.begin() + (t + 1) * k, one.q.begin());
      one.scale[0] = x.scale[t];
      const std::vector<float> alone = run_linear(one, panels.ref(), &pool, n);
      for (int64_t r = 0; r < n; ++r) expect_bits(all[t * n + r], alone[r], "alone", t, r);
    }
    if (first.empty()) first = all;
    for (size_t i = 0; i < all.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(all[i]), std::bit_cast<uint32_t>(first[i]))
          << int8_isa_name(isa) << " differs from " << int8_isa_name(available_int8_isas()[0]);
  }
}

TEST(Int8Linear, F32InputIsQuantizeThenLinear) {
  std::mt19937 rng(9);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const Int8IsaGuard guard;
  // On the calling thread; on the pool with x packed by each thread; with x's rows shared.
  for (const Shape& s :
       {Shape{1, 96, 2048}, Shape{5, 33, 129}, Shape{8, 100, 1000}, Shape{64, 130, 515}}) {
    const int64_t ldx = s.k + 5;
    std::vector<float> x(static_cast<size_t>(s.m * ldx));
    std::uniform_real_distribution<float> d(-3.0f, 3.0f);
    for (auto& v : x) v = d(rng);
    Int8Rows xq;
    xq.resize(s.m, s.k);
    quantize_rows_int8(x.data(), s.m, s.k, ldx, xq.out());
    const Int8Rows w = random_int8_rows(s.n, s.k, rng, -127, 127);
    const Int8Panels panels = Int8Panels::pack(w.ref());
    const std::vector<int64_t> sums = reference_sums(xq, w);
    for (const Int8Isa isa : available_int8_isas()) {
      set_int8_isa(isa);
      std::vector<float> y(static_cast<size_t>(s.m * s.n));
      int8_linear_f32(x.data(), s.m, ldx, panels.ref(), {y.data(), nullptr, s.n}, pool);
      for (int64_t t = 0; t < s.m; ++t)
        for (int64_t r = 0; r < s.n; ++r)
          expect_bits(y[t * s.n + r], reference_output(sums[t * s.n + r], w.scale[r], xq.scale[t]),
                      int8_isa_name(isa), t, r);
    }
  }
}

TEST(Int8Linear, QuantizedProductIsCloseToTheFloatProduct) {
  // A sanity bound, not bit-exactness: per output, |y - x·w| <= Σ_c (|x_c| e_w + |w_c| e_x
  // + e_x e_w) with e = s / 2 per operand (plus fp32 rounding slack).
  std::mt19937 rng(10);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const int64_t m = 4, n = 40, k = 300;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k)), wf(static_cast<size_t>(n * k));
  for (auto& v : x) v = d(rng);
  for (auto& v : wf) v = d(rng) * 0.1f;
  const Int8Rows xq = quantize_int8(x.data(), m, k), wq = quantize_int8(wf.data(), n, k);
  const Int8Panels panels = Int8Panels::pack(wq.ref());
  std::vector<float> y(static_cast<size_t>(m * n));
  int8_linear(xq.ref(), panels.ref(), {y.data(), nullptr, n}, pool);
  for (int64_t t = 0; t < m; ++t)
    for (int64_t r = 0; r < n; ++r) {
      double exact = 0, bound = 0;
      const double ex = xq.scale[t] / 2.0, ew = wq.scale[r] / 2.0;
      for (int64_t c = 0; c < k; ++c) {
        exact += static_cast<double>(x[t * k + c]) * wf[r * k + c];
        bound += std::fabs(x[t * k + c]) * ew + std::fabs(wf[r * k + c]) * ex + ex * ew;
      }
      EXPECT_LE(std::fabs(y[t * n + r] - exact), bound * 1.001 + 1e-6) << t << " " << r;
    }
}

}  // namespace
}  // namespace xds::kernels

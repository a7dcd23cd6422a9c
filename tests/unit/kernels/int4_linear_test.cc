// The int4 linear kernels (int4_linear.h) on every instruction set against a plain reference
// written here from the unpacked q / scale / zero (no packed layout, no vectors):
//   W4A8   exact int64 group sums, then the documented fp32 chain (std::fma per group, × sx):
//          the outputs bit for bit, f32 and bf16, at odd shapes, every G, symmetric and
//          asymmetric, the extremes of q, z and xq, on the pool and on the calling thread;
//   W4A16  a double-precision sum within the header's rounding bound, and the bits of one
//          path the same across token counts and thread splits;
// and the packed layout and the source checks as documented.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "int8_reference.h"
#include "kernels/cpu/int4_linear.h"

namespace xds::kernels {
namespace {

// Unpacked int4 weights: q [rows][cols], scale and zero [rows][cols / G] (zero empty:
// symmetric, 8).
struct Int4Weights {
  std::vector<uint8_t> q;
  std::vector<float> scale;
  std::vector<uint8_t> zero;
  int64_t rows = 0, cols = 0, group_cols = 0;

  int64_t groups() const { return cols / group_cols; }
  int z(int64_t r, int64_t g) const { return zero.empty() ? 8 : zero[r * groups() + g]; }
  Int4Source source() const {
    return {q.data(), scale.data(), zero.empty() ? nullptr : zero.data(), rows, cols, group_cols};
  }
};

Int4Weights random_int4(int64_t rows, int64_t cols, int64_t g, bool asym, std::mt19937& rng) {
  Int4Weights w;
  w.rows = rows, w.cols = cols, w.group_cols = g;
  std::uniform_int_distribution<int> nib(0, 15);
  std::uniform_real_distribution<float> mant(0.5f, 2.0f);
  std::uniform_int_distribution<int> ex(-10, 2);
  w.q.resize(static_cast<size_t>(rows * cols));
  for (auto& v : w.q) v = static_cast<uint8_t>(nib(rng));
  w.scale.resize(static_cast<size_t>(rows * w.groups()));
  for (auto& s : w.scale) s = std::ldexp(mant(rng), ex(rng)) * (nib(rng) < 3 ? -1.0f : 1.0f);
  if (asym) {
    w.zero.resize(w.scale.size());
    for (auto& z : w.zero) z = static_cast<uint8_t>(nib(rng));
  }
  return w;
}

// W4A8 as int4_linear.h documents it: exact group sums, fma chain, × sx.
float reference_a8(const Int8Rows& x, int64_t t, const Int4Weights& w, int64_t r) {
  float f = 0.0f;
  for (int64_t g = 0; g < w.groups(); ++g) {
    int64_t s = 0;
    for (int64_t c = g * w.group_cols; c < (g + 1) * w.group_cols; ++c)
      s += int64_t{x.q[t * x.cols + c]} * (int64_t{w.q[r * w.cols + c]} - w.z(r, g));
    f = std::fma(static_cast<float>(s), w.scale[r * w.groups() + g], f);
  }
  return f * x.scale[t];
}

// W4A16 in double, and the header's bound on an fp32 path's distance from it.
struct A16Reference {
  double y, bound;
};
A16Reference reference_a16(const float* x, const Int4Weights& w, int64_t r) {
  double y = 0, magnitude = 0;
  for (int64_t g = 0; g < w.groups(); ++g) {
    double s = 0, abs_xw = 0, abs_x = 0;
    for (int64_t c = g * w.group_cols; c < (g + 1) * w.group_cols; ++c) {
      const int q = w.q[r * w.cols + c];
      s += double{x[c]} * (q - w.z(r, g));
      abs_xw += std::fabs(x[c]) * std::abs(q - 8);
      abs_x += std::fabs(x[c]);
    }
    const double sw = w.scale[r * w.groups() + g];
    y += sw * s;
    magnitude += std::fabs(sw) * (abs_xw + std::abs(8 - w.z(r, g)) * abs_x);
  }
  const double u = std::ldexp(1.0, -24);
  return {y, 1.01 * static_cast<double>(w.group_cols + w.groups() + 3) * u * magnitude};
}

std::vector<Int4Isa> available_int4_isas() {
  std::vector<Int4Isa> isas;
  for (const Int4Isa isa : {Int4Isa::kScalar, Int4Isa::kAvx2, Int4Isa::kAvx512Vnni})
    if (int4_isa_available(isa)) isas.push_back(isa);
  return isas;
}

struct Int4IsaGuard {
  Int4Isa saved = int4_isa();
  ~Int4IsaGuard() { set_int4_isa(saved); }
};

void expect_bits(float got, float want, const std::string& what, int64_t t, int64_t r) {
  ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
      << what << " token " << t << " row " << r << ": " << got << " vs " << want;
}

struct Case {
  int64_t m, n, groups_odd;  // k = G · groups_odd
};

// m = 1, 3, 13, 33 (one pass, several passes per k block), n off the 32-row pair, k = G · odd
// (k blocks of 16 KB end mid-matrix at G = 32 with 33 groups).
constexpr Case kCases[] = {{1, 33, 1},  {3, 1, 3},  {13, 47, 5}, {33, 100, 7},
                           {1, 97, 33}, {3, 64, 9}, {13, 31, 1}, {2, 70, 3}};

std::string label(Int4Isa isa, int64_t g, bool asym) {
  return std::string(int4_isa_name(isa)) + " G" + std::to_string(g) + (asym ? " asym" : " sym");
}

TEST(Int4Linear, W4A8MatchesTheReferenceBitForBitOnEveryPath) {
  std::mt19937 rng(1);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const Int4IsaGuard guard;
  for (const int64_t g : {32, 64, 128})
    for (const bool asym : {false, true})
      for (const Case& c : kCases) {
        const int64_t k = g * c.groups_odd, ld = c.n + 2;
        const Int4Weights w = random_int4(c.n, k, g, asym, rng);
        const Int8Rows x = random_int8_rows(c.m, k, rng);
        const Int4Panels panels = Int4Panels::pack(w.source());
        for (const Int4Isa isa : available_int4_isas()) {
          set_int4_isa(isa);
          std::vector<float> on_pool(static_cast<size_t>(c.m * ld), NAN), alone = on_pool;
          std::vector<uint16_t> yb(on_pool.size(), 0x7fc1);
          int4_linear(x.ref(), panels.ref(), {on_pool.data(), nullptr, ld}, pool);
          int4_linear_on_thread(x.ref(), panels.ref(), {alone.data(), nullptr, ld});
          int4_linear(x.ref(), panels.ref(), {nullptr, yb.data(), ld}, pool);
          for (int64_t t = 0; t < c.m; ++t) {
            for (int64_t r = 0; r < c.n; ++r) {
              const float want = reference_a8(x, t, w, r);
              expect_bits(on_pool[t * ld + r], want, label(isa, g, asym), t, r);
              expect_bits(alone[t * ld + r], want, label(isa, g, asym), t, r);
              ASSERT_EQ(yb[t * ld + r], f32_to_bf16(want)) << label(isa, g, asym) << " bf16";
            }
            for (int64_t r = c.n; r < ld; ++r) {
              ASSERT_TRUE(std::isnan(on_pool[t * ld + r])) << "wrote past the rows";
              ASSERT_EQ(yb[t * ld + r], 0x7fc1) << "wrote past the rows";
            }
          }
        }
      }
}

TEST(Int4Linear, W4A8ExtremeValuesAreExact) {
  // Rows of q = 0 and q = 15 against zero points 0 and 15, x = ±127 and -128: every group
  // sum at its largest magnitude, 128 · 15 · 128 = 245760 (< 2^24, so float(s) exact).
  const int64_t g = 128, k = g * 9, n = 6;
  Int4Weights w;
  w.rows = n, w.cols = k, w.group_cols = g;
  w.q.resize(static_cast<size_t>(n * k));
  w.scale.assign(static_cast<size_t>(n * w.groups()), 1.0f);
  w.zero.resize(w.scale.size());
  const uint8_t q_of[n] = {0, 15, 0, 15, 7, 8};
  const uint8_t z_of[n] = {15, 0, 0, 15, 8, 7};
  for (int64_t r = 0; r < n; ++r) {
    std::fill(w.q.begin() + r * k, w.q.begin() + (r + 1) * k, q_of[r]);
    std::fill(w.zero.begin() + r * w.groups(), w.zero.begin() + (r + 1) * w.groups(), z_of[r]);
  }
  Int8Rows x;
  x.resize(4, k);
  const int8_t x_of[3] = {127, -127, -128};
  for (int64_t t = 0; t < 3; ++t)
    std::fill(x.q.begin() + t * k, x.q.begin() + (t + 1) * k, x_of[t]);
  for (int64_t c = 0; c < k; ++c) x.q[3 * k + c] = static_cast<int8_t>(c % 2 == 0 ? 127 : -128);
  std::fill(x.scale.begin(), x.scale.end(), 1.0f);
  EXPECT_EQ(reference_a8(x, 2, w, 0), -128.0f * -15 * k);  // the largest: 245760 a group
  const Int4Panels panels = Int4Panels::pack(w.source());
  const Int4IsaGuard guard;
  for (const Int4Isa isa : available_int4_isas()) {
    set_int4_isa(isa);
    std::vector<float> y(static_cast<size_t>(4 * n));
    int4_linear_on_thread(x.ref(), panels.ref(), {y.data(), nullptr, n});
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t r = 0; r < n; ++r)
        expect_bits(y[t * n + r], reference_a8(x, t, w, r), int4_isa_name(isa), t, r);
  }
}

std::vector<float> random_floats(int64_t count, std::mt19937& rng) {
  std::vector<float> v(static_cast<size_t>(count));
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  for (auto& e : v) e = d(rng);
  return v;
}

TEST(Int4Linear, W4A16IsWithinTheRoundingBoundOnEveryPath) {
  std::mt19937 rng(2);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const Int4IsaGuard guard;
  for (const int64_t g : {32, 64, 128})
    for (const bool asym : {false, true})
      for (const Case& c : kCases) {
        const int64_t k = g * c.groups_odd, ldx = k + 3, ld = c.n + 1;
        const Int4Weights w = random_int4(c.n, k, g, asym, rng);
        const std::vector<float> x = random_floats(c.m * ldx, rng);
        const Int4Panels panels = Int4Panels::pack(w.source());
        for (const Int4Isa isa : available_int4_isas()) {
          set_int4_isa(isa);
          std::vector<float> y(static_cast<size_t>(c.m * ld), NAN), alone = y;
          std::vector<uint16_t> yb(y.size());
          int4_linear_f32(x.data(), c.m, ldx, panels.ref(), {y.data(), nullptr, ld}, pool);
          int4_linear_f32_on_thread(x.data(), c.m, ldx, panels.ref(), {alone.data(), nullptr, ld});
          int4_linear_f32(x.data(), c.m, ldx, panels.ref(), {nullptr, yb.data(), ld}, pool);
          for (int64_t t = 0; t < c.m; ++t) {
            for (int64_t r = 0; r < c.n; ++r) {
              const A16Reference want = reference_a16(x.data() + t * ldx, w, r);
              ASSERT_LE(std::fabs(y[t * ld + r] - want.y), want.bound)
                  << label(isa, g, asym) << " m " << c.m << " token " << t << " row " << r;
              expect_bits(alone[t * ld + r], y[t * ld + r], label(isa, g, asym), t, r);
              ASSERT_EQ(yb[t * ld + r], f32_to_bf16(y[t * ld + r])) << label(isa, g, asym);
            }
            ASSERT_TRUE(std::isnan(y[t * ld + c.n])) << "wrote past the rows";
          }
        }
      }
}

TEST(Int4Linear, W4A16Bf16InputIsTheWidenedF32Input) {
  std::mt19937 rng(3);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const int64_t m = 5, n = 70, k = 64 * 5;
  const Int4Weights w = random_int4(n, k, 64, true, rng);
  const std::vector<float> x = random_floats(m * k, rng);
  std::vector<uint16_t> xb(x.size());
  std::vector<float> widened(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = f32_to_bf16(x[i]);
    widened[i] = bf16_to_f32(xb[i]);
  }
  const Int4Panels panels = Int4Panels::pack(w.source());
  const Int4IsaGuard guard;
  for (const Int4Isa isa : available_int4_isas()) {
    set_int4_isa(isa);
    std::vector<float> from_bf16(static_cast<size_t>(m * n)), from_f32 = from_bf16;
    int4_linear_bf16(xb.data(), m, k, panels.ref(), {from_bf16.data(), nullptr, n}, pool);
    int4_linear_f32(widened.data(), m, k, panels.ref(), {from_f32.data(), nullptr, n}, pool);
    for (int64_t i = 0; i < m * n; ++i)
      expect_bits(from_bf16[i], from_f32[i], int4_isa_name(isa), i / n, i % n);
  }
}

// Every output of a batch against the same token alone, on pools of 1, 2 and 3 threads
// (the chunks of pairs fall differently): the same bits, W4A8 and W4A16, every path; and
// W4A8 the same bits across paths.
TEST(Int4Linear, ATokenGivesTheSameBitsAloneInABatchAndOnAnyThreadSplit) {
  std::mt19937 rng(4);
  ThreadPool pool1(1, ThreadPool::kNoSpin), pool2(2, ThreadPool::kNoSpin),
      pool3(3, ThreadPool::kNoSpin);
  const int64_t m = 13, n = 200, k = 128 * 9;
  const Int4Weights w = random_int4(n, k, 128, true, rng);
  const Int8Rows xq = random_int8_rows(m, k, rng, -127, 127);
  const std::vector<float> xf = random_floats(m * k, rng);
  const Int4Panels panels = Int4Panels::pack(w.source());
  const Int4IsaGuard guard;
  std::vector<float> first_a8;
  for (const Int4Isa isa : available_int4_isas()) {
    set_int4_isa(isa);
    std::vector<float> a8(static_cast<size_t>(m * n)), a16 = a8;
    int4_linear(xq.ref(), panels.ref(), {a8.data(), nullptr, n}, pool2);
    int4_linear_f32(xf.data(), m, k, panels.ref(), {a16.data(), nullptr, n}, pool2);
    for (ThreadPool* pool : {&pool1, &pool3}) {
      std::vector<float> b8(a8.size()), b16(a8.size());
      int4_linear(xq.ref(), panels.ref(), {b8.data(), nullptr, n}, *pool);
      int4_linear_f32(xf.data(), m, k, panels.ref(), {b16.data(), nullptr, n}, *pool);
      for (int64_t i = 0; i < m * n; ++i) {
        expect_bits(b8[i], a8[i], std::string("W4A8 split ") + int4_isa_name(isa), i / n, i % n);
        expect_bits(b16[i], a16[i], std::string("W4A16 split ") + int4_isa_name(isa), i / n, i % n);
      }
    }
    for (const int64_t t : {int64_t{0}, int64_t{6}, m - 1}) {
      Int8Rows one;
      one.resize(1, k);
      std::copy(xq.q.begin() + t * k, xq.q.begin() + (t + 1) * k, one.q.begin());
      one.scale[0] = xq.scale[t];
      std::vector<float> y8(static_cast<size_t>(n)), y16(static_cast<size_t>(n));
      int4_linear(one.ref(), panels.ref(), {y8.data(), nullptr, n}, pool2);
      int4_linear_f32(xf.data() + t * k, 1, k, panels.ref(), {y16.data(), nullptr, n}, pool2);
      for (int64_t r = 0; r < n; ++r) {
        expect_bits(y8[r], a8[t * n + r], std::string("W4A8 alone ") + int4_isa_name(isa), t, r);
        expect_bits(y16[r], a16[t * n + r], std::string("W4A16 alone ") + int4_isa_name(isa), t, r);
      }
    }
    if (first_a8.empty()) first_a8 = a8;
    for (int64_t i = 0; i < m * n; ++i)
      expect_bits(a8[i], first_a8[i], std::string("W4A8 across paths ") + int4_isa_name(isa), i / n,
                  i % n);
  }
}

TEST(Int4Linear, PackedLayoutAsDocumented) {
  std::mt19937 rng(5);
  const int64_t n = 45, g = 32, k = 64;  // two pairs (the second 13 rows real), 2 groups
  const Int4Weights w = random_int4(n, k, g, true, rng);
  const Int4Panels panels = Int4Panels::pack(w.source());
  const Int4PanelsRef ref = panels.ref();
  ASSERT_EQ(ref.pairs(), 2);
  ASSERT_EQ(ref.groups(), 2);
  ASSERT_EQ(ref.data_bytes(), 2 * (k / 4) * 64);
  ASSERT_EQ(ref.bytes_read(), 2 * 16 * k + 64 * 2 * 5);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(ref.data) % 64, 0u);
  const auto q = [&](int64_t r, int64_t c) { return r < n ? w.q[r * k + c] : 0; };
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t u = 0; u < k / 4; ++u)
      for (int j = 0; j < 16; ++j)
        for (int i = 0; i < 4; ++i) {
          const int64_t r = 32 * p + j, c = 4 * u + i;
          ASSERT_EQ(ref.data[(p * (k / 4) + u) * 64 + 4 * j + i], q(r, c) | q(r + 16, c) << 4)
              << r << " " << c;
        }
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t gi = 0; gi < 2; ++gi)
      for (int j = 0; j < 32; ++j) {
        const int64_t r = 32 * p + j, at = (p * 2 + gi) * 32 + j;
        EXPECT_EQ(ref.scale[at], r < n ? w.scale[r * 2 + gi] : 0.0f) << r;
        EXPECT_EQ(ref.zero[at], r < n ? w.zero[r * 2 + gi] : 0) << r;
      }
  const Int4Panels sym = Int4Panels::pack(random_int4(n, k, g, false, rng).source());
  EXPECT_EQ(sym.ref().zero, nullptr);
  EXPECT_EQ(sym.ref().bytes_read(), 2 * 16 * k + 64 * 2 * 4);
}

TEST(Int4Linear, SourceChecksNameTheProblem) {
  std::mt19937 rng(6);
  Int4Weights w = random_int4(3, 128, 64, true, rng);
  EXPECT_TRUE(check_int4_source(w.source()).ok());
  Int4Source bad = w.source();
  bad.group_cols = 48;
  Status s = check_int4_source(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("group of 48"), std::string::npos) << s.message();
  bad = w.source();
  bad.cols = 96;  // not a multiple of 64
  s = check_int4_source(bad);
  EXPECT_NE(s.message().find("96 columns is not a multiple of the group of 64"), std::string::npos)
      << s.message();
  w.q[1 * 128 + 5] = 16;
  s = check_int4_source(w.source());
  EXPECT_NE(s.message().find("q[1][5] = 16"), std::string::npos) << s.message();
  w.q[1 * 128 + 5] = 15;
  w.zero[2 * 2 + 1] = 200;
  s = check_int4_source(w.source());
  EXPECT_NE(s.message().find("zero[2][1] = 200"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace xds::kernels

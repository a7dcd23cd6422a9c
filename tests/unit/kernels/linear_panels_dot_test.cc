// The bf16 dot-product panel kernel (panels_linear_bf16) against a plain loop that adds the
// column pairs as vdpbf16ps is documented to (Intel SDM: per lane, the odd element's
// product, then the even one's, each addition rounded to nearest even, denormal inputs and
// outputs flushed to zero), against a double reference that reads the row-major weights,
// and for batch invariance. Skipped where the build has no AVX512_BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "tensor/dtype.h"

namespace xds::kernels {
namespace {

struct Bf16Matrix {
  std::vector<uint16_t> rows_major, panels;
  MatrixRef ref;
};

Bf16Matrix make_matrix(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  Bf16Matrix m;
  m.rows_major.resize(static_cast<size_t>(rows * cols));
  for (auto& v : m.rows_major) v = f32_to_bf16(d(rng));
  m.ref = MatrixRef{DType::kBF16, nullptr, rows, cols, MatrixLayout::kPanels16};
  m.panels.assign(static_cast<size_t>(m.ref.bytes() / 2), 0xFFFF);
  pack_panels16(m.rows_major.data(), rows, cols, 0, m.ref.panels(), m.panels.data());
  m.ref.data = m.panels.data();
  return m;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

float flush_denormal(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
}

// One lane's sum as the instruction adds it: pairs (c, c + 1) in ascending c, the odd
// column's product first; an odd last column pairs with zero.
float documented_dot(const uint16_t* x, const uint16_t* w, int64_t cols) {
  float acc = 0.0f;
  for (int64_t c = 0; c < cols; c += 2) {
    const float x0 = flush_denormal(bf16_to_f32(x[c])), w0 = flush_denormal(bf16_to_f32(w[c]));
    const float x1 = c + 1 < cols ? flush_denormal(bf16_to_f32(x[c + 1])) : 0.0f;
    const float w1 = c + 1 < cols ? flush_denormal(bf16_to_f32(w[c + 1])) : 0.0f;
    acc = flush_denormal(acc + x1 * w1);  // bf16 × bf16 is exact in fp32
    acc = flush_denormal(acc + x0 * w0);
  }
  return acc;
}

TEST(LinearPanelsDot, AddsColumnPairsAsTheInstructionIsDocumented) {
  if (!panels_dot_available()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  std::mt19937 rng(21);
  struct Case {
    int64_t n, rows, cols;
  };
  // 1-12 tokens in one pass (2-panel tiles, a single panel, a padded one), more in k blocks
  // of 512 (cols > 512, odd widths: a last column paired with zeros), 4 KB prefetch tails.
  for (const Case c : {Case{1, 16, 2}, Case{1, 37, 71}, Case{2, 48, 33}, Case{3, 16, 1},
                       Case{5, 64, 300}, Case{8, 35, 520}, Case{12, 50, 1025}, Case{13, 33, 600},
                       Case{25, 80, 1031}, Case{40, 17, 64}}) {
    const Bf16Matrix w = make_matrix(c.rows, c.cols, rng);
    const auto x = random_bf16(static_cast<size_t>(c.n * c.cols), rng);
    std::vector<float> y(static_cast<size_t>(c.n * c.rows), -7.0f);
    panels_linear_bf16(x.data(), c.n, c.cols, w.ref, 0, w.ref.panels(), y.data(), c.rows);
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t r = 0; r < c.rows; ++r) {
        const float expect =
            documented_dot(x.data() + t * c.cols, w.rows_major.data() + r * c.cols, c.cols);
        ASSERT_EQ(y[t * c.rows + r], expect)
            << "n=" << c.n << " rows=" << c.rows << " cols=" << c.cols << " t=" << t << " r=" << r;
      }
    }
  }
}

TEST(LinearPanelsDot, DenormalInputsCountAsZero) {
  if (!panels_dot_available()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  // One row, two columns: x = (2^-130, 1), w = (1, 0.5). The denormal x[0] is flushed, so
  // the sum is 0.5 exactly (it would be 0.5 + 2^-130 = 0.5 in fp32 anyway); with
  // x = (2^-130, 0) the sum is 0, where an exact product would leave 2^-130.
  Bf16Matrix w;
  w.rows_major = {f32_to_bf16(1.0f), f32_to_bf16(0.5f)};
  w.ref = MatrixRef{DType::kBF16, nullptr, 1, 2, MatrixLayout::kPanels16};
  w.panels.assign(static_cast<size_t>(w.ref.bytes() / 2), 0);
  pack_panels16(w.rows_major.data(), 1, 2, 0, 1, w.panels.data());
  w.ref.data = w.panels.data();
  const uint16_t tiny = f32_to_bf16(std::ldexp(1.0f, -130));
  ASSERT_EQ(std::fpclassify(bf16_to_f32(tiny)), FP_SUBNORMAL);
  const uint16_t x[2] = {tiny, 0};
  float y = -1.0f;
  panels_linear_bf16(x, 1, 2, w.ref, 0, 1, &y, 1);
  EXPECT_EQ(y, 0.0f);
}

TEST(LinearPanelsDot, MatchesDoubleReferenceThroughLinearBf16) {
  if (!panels_dot_available()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  std::mt19937 rng(23);
  ThreadPool pool(2);
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}}) {
    const int64_t rows = 300, cols = 777;
    const Bf16Matrix w = make_matrix(rows, cols, rng);
    const auto x = random_bf16(static_cast<size_t>(n * cols), rng);
    std::vector<float> y(static_cast<size_t>(n * rows));
    linear_bf16(x.data(), n, cols, w.ref, y.data(), rows, pool);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double ref = 0.0, mag = 0.0;
        for (int64_t k = 0; k < cols; ++k) {
          const double prod = static_cast<double>(bf16_to_f32(x[t * cols + k])) *
                              bf16_to_f32(w.rows_major[r * cols + k]);
          ref += prod;
          mag += std::fabs(prod);
        }
        ASSERT_NEAR(y[t * rows + r], ref, 1e-6 * mag) << "n=" << n << " t=" << t << " r=" << r;
      }
    }
  }
}

TEST(LinearPanelsDot, TokenResultsDoNotDependOnTheBatchOrTheThreads) {
  if (!panels_dot_available()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  std::mt19937 rng(29);
  const int64_t rows = 280, cols = 1301, n_max = 70;
  const Bf16Matrix w = make_matrix(rows, cols, rng);
  const auto x = random_bf16(static_cast<size_t>(n_max * cols), rng);
  ThreadPool one(1), two(2);
  std::vector<float> alone(static_cast<size_t>(n_max * rows));
  for (int64_t t = 0; t < n_max; ++t)
    linear_bf16(x.data() + t * cols, 1, cols, w.ref, alone.data() + t * rows, rows, one);
  for (const int64_t n : {int64_t{2}, int64_t{12}, int64_t{13}, int64_t{37}, n_max}) {
    for (ThreadPool* pool : {&one, &two}) {
      std::vector<float> y(static_cast<size_t>(n * rows));
      linear_bf16(x.data(), n, cols, w.ref, y.data(), rows, *pool);
      ASSERT_EQ(std::memcmp(y.data(), alone.data(), y.size() * sizeof(float)), 0)
          << "n=" << n << " threads=" << pool->num_threads();
    }
  }
}

}  // namespace
}  // namespace xds::kernels

// The vectorised exp and the loops built on it against std::exp in double precision.
#include "kernels/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"

namespace xds::kernels {
namespace {

TEST(VecMath, ExpIsWithinTwoUlpOfTheExactValue) {
  // A dense sweep of the whole non-clamped range, 8 values per call.
  double worst = 0.0;
  for (double start = -87.0; start < 88.3 - 8 * 0.00137; start += 8 * 0.00137) {
    alignas(32) float in[8], out[8];
    for (int i = 0; i < 8; ++i) in[i] = static_cast<float>(start + i * 0.00137);
    _mm256_store_ps(out, exp_avx2(_mm256_load_ps(in)));
    for (int i = 0; i < 8; ++i) {
      const double exact = std::exp(static_cast<double>(in[i]));
      const double rel = std::fabs(out[i] - exact) / exact;
      worst = std::max(worst, rel);
      ASSERT_LE(rel, 2.4e-7) << "x = " << in[i];  // 2 ulp of float: 2 · 2^-23
    }
  }
  EXPECT_GT(worst, 0.0);  // the sweep did compare something inexact
}

TEST(VecMath, ExpClampsOutsideItsRange) {
  alignas(32) float in[8] = {-1000.0f, -88.0f, -87.5f, 0.0f, 1.0f, 88.4f, 100.0f, 1e30f};
  alignas(32) float out[8];
  _mm256_store_ps(out, exp_avx2(_mm256_load_ps(in)));
  const float low = std::exp(-87.0f), high = std::exp(88.3f);
  EXPECT_NEAR(out[0], low, low * 3e-7);  // clamped to exp(-87): normal, not 0 or NaN
  EXPECT_NEAR(out[1], low, low * 3e-7);
  EXPECT_NEAR(out[2], low, low * 3e-7);
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_NEAR(out[4], std::exp(1.0), 3e-7 * std::exp(1.0));
  for (int i = 5; i < 8; ++i) {
    EXPECT_TRUE(std::isfinite(out[i]));
    EXPECT_NEAR(out[i], high, high * 3e-7);
  }
}

#if defined(__AVX512F__)
// The 16-lane exp runs the same steps: the same bits as the 8-lane one, lane by lane, over
// the range and past both clamps.
TEST(VecMath, Avx512ExpGivesTheAvx2Bits) {
  for (double start = -100.0; start < 100.0; start += 16 * 0.0031) {
    alignas(64) float in[16], wide[16], narrow[16];
    for (int i = 0; i < 16; ++i) in[i] = static_cast<float>(start + i * 0.0031);
    _mm512_store_ps(wide, exp_avx512(_mm512_load_ps(in)));
    _mm256_store_ps(narrow, exp_avx2(_mm256_load_ps(in)));
    _mm256_store_ps(narrow + 8, exp_avx2(_mm256_load_ps(in + 8)));
    for (int i = 0; i < 16; ++i) ASSERT_EQ(wide[i], narrow[i]) << "x = " << in[i];
  }
}
#endif

TEST(VecMath, SoftmaxPiecesMatchPlainLoops) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-20.0f, 20.0f);
  for (const int64_t n : {1, 7, 8, 9, 100, 513}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = d(rng);
    std::vector<float> y = x;
    const float mx = scale_and_max(y.data(), n, 0.37f);
    double want_max = -1e300;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(y[i], x[i] * 0.37f) << i;  // the same single rounding
      want_max = std::max(want_max, static_cast<double>(x[i] * 0.37f));
    }
    EXPECT_EQ(mx, static_cast<float>(want_max));
    const std::vector<float> scaled = y;
    const float sum = exp_shifted_sum(y.data(), n, mx);
    double want_sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      // The shift is subtracted in float (the stated rounding point), then exp exactly.
      const float arg = scaled[i] - mx;
      const double e = std::exp(static_cast<double>(arg));
      EXPECT_NEAR(y[i], e, 3e-7 * e + 1e-30) << "n=" << n << " i=" << i;
      want_sum += e;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << "n=" << n;
  }
}

TEST(VecMath, SiluMulMatchesItsFormula) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> d(-30.0f, 30.0f);
  const int64_t n = 1003;  // vector body and a scalar tail
  std::vector<float> g(n), u(n), out(n);
  for (int64_t i = 0; i < n; ++i) g[i] = d(rng), u[i] = d(rng);
  g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f;
  silu_mul(g.data(), u.data(), n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-30) << "g=" << g[i];
  }
}

}  // namespace
}  // namespace xds::kernels

// Per-row int8 quantization against its definition (int8_quant.h) written out in the test:
// s = absmax / 127, q = the integer nearest x / s (ties to even), zero rows all zero; the
// round trip within s / 2 (plus the two fp32 roundings); bf16 input as its widened f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "kernels/cpu/int8_quant.h"

namespace xds::kernels {
namespace {

// Round half to even on a float holding x / s, done by hand (no nearbyint).
int reference_round(float v) {
  const double f = std::floor(static_cast<double>(v));
  const double frac = static_cast<double>(v) - f;
  long r = static_cast<long>(f);
  if (frac > 0.5 || (frac == 0.5 && r % 2 != 0)) ++r;
  return static_cast<int>(std::clamp<long>(r, -127, 127));
}

std::vector<float> random_row(int64_t cols, float magnitude, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(cols));
  for (auto& v : x) v = d(rng) * magnitude;
  return x;
}

TEST(Int8Quant, MatchesTheDefinitionAtOddLengths) {
  std::mt19937 rng(7);
  for (const int64_t cols : {1, 3, 7, 8, 9, 16, 33, 129, 2048}) {
    for (const float magnitude : {1e-3f, 1.0f, 37.5f, 3e4f}) {
      const std::vector<float> x = random_row(cols, magnitude, rng);
      std::vector<int8_t> q(static_cast<size_t>(cols));
      const float s = quantize_row_int8(x.data(), cols, q.data());
      float absmax = 0;
      for (const float v : x) absmax = std::max(absmax, std::fabs(v));
      ASSERT_EQ(s, absmax / 127.0f) << cols;
      for (int64_t i = 0; i < cols; ++i) {
        ASSERT_EQ(q[i], reference_round(x[i] / s)) << "cols " << cols << " i " << i;
        ASSERT_GE(q[i], -127);
      }
    }
  }
}

TEST(Int8Quant, LargestElementIsPlusOrMinus127AndTiesGoToEven) {
  // absmax 127: s = 1 exactly, so x / s = x and the ties are visible.
  const std::vector<float> x = {127.0f, 2.5f, 3.5f,    -2.5f,  -3.5f,      0.5f,
                                -0.5f,  1.5f, -127.0f, 126.5f, 0.49999997f};
  std::vector<int8_t> q(x.size());
  const float s = quantize_row_int8(x.data(), static_cast<int64_t>(x.size()), q.data());
  EXPECT_EQ(s, 1.0f);
  const std::vector<int8_t> want = {127, 2, 4, -2, -4, 0, 0, 2, -127, 126, 0};
  EXPECT_EQ(q, want);
  // Negative largest element: -127.
  const std::vector<float> y = {-5.0f, 1.0f, 2.5f};
  std::vector<int8_t> qy(3);
  quantize_row_int8(y.data(), 3, qy.data());
  EXPECT_EQ(qy[0], -127);
}

TEST(Int8Quant, ZeroRowHasScaleZeroAndZeros) {
  const std::vector<float> x(37, 0.0f);
  std::vector<int8_t> q(37, 99);
  EXPECT_EQ(quantize_row_int8(x.data(), 37, q.data()), 0.0f);
  for (const int8_t v : q) EXPECT_EQ(v, 0);
  const std::vector<float> neg(9, -0.0f);
  EXPECT_EQ(quantize_row_int8(neg.data(), 9, q.data()), 0.0f);
}

TEST(Int8Quant, RoundTripWithinHalfAScale) {
  std::mt19937 rng(11);
  const int64_t rows = 13, cols = 515;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row = random_row(cols, std::ldexp(1.0f, static_cast<int>(r) - 6), rng);
    std::copy(row.begin(), row.end(), x.begin() + r * cols);
  }
  const Int8Rows q = quantize_int8(x.data(), rows, cols);
  std::vector<float> back(x.size());
  dequantize_rows_int8(q.ref(), back.data(), cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = q.scale[r];
    const double bound = s / 2.0 * (1.0 + std::ldexp(1.0, -14));
    for (int64_t i = 0; i < cols; ++i) {
      const size_t k = static_cast<size_t>(r * cols + i);
      ASSERT_EQ(back[k], static_cast<float>(q.q[k]) * s);
      ASSERT_LE(std::fabs(static_cast<double>(x[k]) - back[k]), bound) << r << " " << i;
    }
  }
}

TEST(Int8Quant, Bf16RowsQuantizeAsTheirWidenedValues) {
  std::mt19937 rng(3);
  const int64_t rows = 5, cols = 77;
  std::vector<uint16_t> xb(static_cast<size_t>(rows * cols));
  std::vector<float> xf(xb.size());
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  for (size_t i = 0; i < xb.size(); ++i) {
    xb[i] = f32_to_bf16(d(rng));
    xf[i] = bf16_to_f32(xb[i]);
  }
  const Int8Rows a = quantize_int8(xb.data(), rows, cols);
  const Int8Rows b = quantize_int8(xf.data(), rows, cols);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.scale, b.scale);
}

TEST(Int8Quant, StridedRowsLeaveTheGapsAlone) {
  std::mt19937 rng(5);
  const int64_t rows = 3, cols = 10, ldx = 16, ldq = 12;
  const std::vector<float> x = random_row(rows * ldx, 2.0f, rng);
  std::vector<int8_t> q(static_cast<size_t>(rows * ldq), 55);
  std::vector<float> s(rows);
  quantize_rows_int8(x.data(), rows, cols, ldx, {q.data(), s.data(), ldq});
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int8_t> one(cols);
    EXPECT_EQ(s[r], quantize_row_int8(x.data() + r * ldx, cols, one.data()));
    for (int64_t i = 0; i < cols; ++i) EXPECT_EQ(q[r * ldq + i], one[i]);
    for (int64_t i = cols; i < ldq; ++i) EXPECT_EQ(q[r * ldq + i], 55);
  }
}

}  // namespace
}  // namespace xds::kernels

#include "quant/smooth_quant.h"

#include <gtest/gtest.h>

namespace xds {
namespace {

// Hand-derived: raw = a^α / w^(1−α), then the nearest power of two in log2.
TEST(SmoothQuant, ScalesByHand) {
  const std::vector<float> act = {4.0f, 1.0f, 0.0f, 9.0f, 2.0f};
  const std::vector<float> wmax = {1.0f, 4.0f, 2.0f, 1.0f, 0.0f};
  // α = 0.5: √4/√1 = 2; √1/√4 = 0.5; a = 0 -> 1; √9/√1 = 3 -> log2 1.58 -> 4; w = 0 -> 1
  EXPECT_EQ(smooth_scales(act, wmax, 0.5), (std::vector<float>{2.0f, 0.5f, 1.0f, 4.0f, 1.0f}));
  // α = 1: raw = a: 4, 1, -, 9 -> log2 3.17 -> 8, -
  EXPECT_EQ(smooth_scales(act, wmax, 1.0), (std::vector<float>{4.0f, 1.0f, 1.0f, 8.0f, 1.0f}));
  // α = 0: raw = 1 / w: 1, 0.25, -, 1, -
  EXPECT_EQ(smooth_scales(act, wmax, 0.0), (std::vector<float>{1.0f, 0.25f, 1.0f, 1.0f, 1.0f}));
}

TEST(SmoothQuant, FoldKeepsTheProductExact) {
  // (x ⊙ γ / s) · (W diag(s))ᵀ == (x ⊙ γ) · Wᵀ bit for bit: s are powers of two.
  std::vector<float> gamma = {0.3f, 1.7f, -0.9f};
  std::vector<float> w = {0.11f, -0.52f, 0.33f, 0.71f, 0.05f, -0.27f};  // [2, 3]
  const std::vector<float> x = {1.5f, -2.25f, 0.125f};
  auto y = [&](const std::vector<float>& g, const std::vector<float>& m) {
    std::vector<float> out(2, 0.0f);
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) out[r] += (x[c] * g[c]) * m[r * 3 + c];
    return out;
  };
  const std::vector<float> before = y(gamma, w);
  std::vector<float> wmax(3, 0.0f);
  accumulate_column_max(w, 2, 3, wmax);
  EXPECT_EQ(wmax, (std::vector<float>{0.71f, 0.52f, 0.33f}));
  const std::vector<float> act = {8.0f, 0.01f, 3.0f};
  const std::vector<float> s = smooth_scales(act, wmax, 0.5);
  EXPECT_NE(s, std::vector<float>(3, 1.0f));
  scale_columns(w, 2, 3, s);
  divide_by(gamma, s);
  EXPECT_EQ(y(gamma, w), before);
}

}  // namespace
}  // namespace xds

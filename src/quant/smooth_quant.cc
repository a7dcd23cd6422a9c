#include "quant/smooth_quant.h"

#include <algorithm>
#include <cmath>

namespace xds {

std::vector<float> smooth_scales(std::span<const float> act_max, std::span<const float> weight_max,
                                 double alpha) {
  std::vector<float> s(act_max.size(), 1.0f);
  for (size_t j = 0; j < act_max.size(); ++j) {
    const double a = act_max[j], w = weight_max[j];
    if (!(a > 0.0) || !(w > 0.0)) continue;
    const double raw = std::pow(a, alpha) / std::pow(w, 1.0 - alpha);
    if (!std::isfinite(raw) || raw <= 0.0) continue;
    s[j] = static_cast<float>(std::ldexp(1.0, static_cast<int>(std::lround(std::log2(raw)))));
  }
  return s;
}

void accumulate_column_max(std::span<const float> w, int64_t rows, int64_t cols,
                           std::span<float> weight_max) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      weight_max[c] = std::max(weight_max[c], std::fabs(w[r * cols + c]));
}

void scale_columns(std::span<float> w, int64_t rows, int64_t cols, std::span<const float> s) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] *= s[c];
}

void divide_by(std::span<float> gamma, std::span<const float> s) {
  for (size_t j = 0; j < gamma.size(); ++j) gamma[j] /= s[j];
}

}  // namespace xds

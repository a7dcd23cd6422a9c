#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace xds {
namespace {

double yarn_get_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

double yarn_correction_dim(double num_rotations, int64_t dim, double base, double max_pos) {
  return (static_cast<double>(dim) * std::log(max_pos / (num_rotations * 2.0 * std::numbers::pi))) /
         (2.0 * std::log(base));
}

}  // namespace

RopeTable::RopeTable(const RopeParams& c) : dim_(c.dim) {
  const int64_t half = dim_ / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq_[i] =
        std::pow(c.theta, -2.0 * static_cast<double>(i) / static_cast<double>(dim_));
  }
  softmax_scale_ = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim));
  if (c.scaling) {
    const RopeScaling& y = *c.scaling;
    double low = std::floor(yarn_correction_dim(
        y.beta_fast, dim_, c.theta, static_cast<double>(y.original_max_position_embeddings)));
    double high = std::ceil(yarn_correction_dim(
        y.beta_slow, dim_, c.theta, static_cast<double>(y.original_max_position_embeddings)));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim_ - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation_weight = 1.0 - ramp;
      const double extra = inv_freq_[i];
      const double inter = extra / y.factor;
      inv_freq_[i] = inter * (1.0 - extrapolation_weight) + extra * extrapolation_weight;
    }
    mscale_ = yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim);
    if (y.mscale_all_dim != 0.0) {
      const double m = yarn_get_mscale(y.factor, y.mscale_all_dim);
      softmax_scale_ *= m * m;
    }
  }
}

void RopeTable::ensure(int64_t max_position) {
  if (max_position <= size_) return;
  const int64_t new_size = std::max(max_position, size_ * 2);
  table_.resize(static_cast<size_t>(new_size * dim_));
  for (int64_t p = size_; p < new_size; ++p) {
    float* row = table_.data() + p * dim_;
    for (int64_t i = 0; i < dim_ / 2; ++i) {
      const double angle = static_cast<double>(p) * inv_freq_[i];
      row[2 * i] = static_cast<float>(std::cos(angle) * mscale_);
      row[2 * i + 1] = static_cast<float>(std::sin(angle) * mscale_);
    }
  }
  size_ = new_size;
}

}  // namespace xds

// Rotary position tables for MLA's rope part (plain or YaRN), interleaved-pair layout.
//
// cos_sin(p) points at [rope_dim] floats: [2i] = cos(p·f_i)·m, [2i+1] = sin(p·f_i)·m, where
// f_i and m (the YaRN mscale on cos/sin) follow docs/design/deepseek_v3_forward.md.
// Thread-safety: ensure() grows the table and must not run concurrently with readers.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace xds {

class RopeTable {
 public:
  explicit RopeTable(const DeepseekV3Config& config);

  // Makes positions [0, max_position) available.
  void ensure(int64_t max_position);
  const float* cos_sin(int64_t position) const { return table_.data() + position * dim_; }

  // The attention softmax scale, (Dn + Dr)^-0.5 times the YaRN mscale_all_dim² correction.
  double softmax_scale() const { return softmax_scale_; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  double cos_sin_scale() const { return mscale_; }

 private:
  int64_t dim_;
  std::vector<double> inv_freq_;  // [dim / 2]
  double mscale_ = 1.0;
  double softmax_scale_ = 1.0;
  int64_t size_ = 0;
  std::vector<float> table_;  // [size_, dim_]
};

}  // namespace xds

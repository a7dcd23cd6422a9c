// Rotary position tables for MLA's rope part (plain or YaRN), interleaved-pair layout.
//
// cos_sin(p) points at [rope_dim] floats: [2i] = cos(p·f_i)·m, [2i+1] = sin(p·f_i)·m, where
// f_i and m (the YaRN mscale on cos/sin) follow docs/design/deepseek_v3_forward.md.
// Thread-safety: ensure() grows the table and must not run concurrently with readers.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace xds {

struct RopeScaling {  // YaRN
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct RopeParams {
  int64_t dim = 0;          // rope dims per head (even)
  int64_t qk_head_dim = 0;  // the whole query/key head (the softmax scale's base)
  double theta = 10000.0;
  std::optional<RopeScaling> scaling;  // none: plain rope
};

class RopeTable {
 public:
  explicit RopeTable(const RopeParams& params);

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

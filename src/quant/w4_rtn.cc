#include "quant/w4_rtn.h"

#include <algorithm>
#include <cmath>

#include "base/bf16.h"

namespace xds {
namespace {

float round_to(DType dt, float v) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

}  // namespace

W4GroupParams w4_group_params(const float* w, int64_t group_cols, bool symmetric,
                              DType scale_dtype) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t c = 0; c < group_cols; ++c) {
    lo = std::min(lo, w[c]);
    hi = std::max(hi, w[c]);
  }
  W4GroupParams p;
  p.scale = round_to(scale_dtype, symmetric ? std::max(-lo, hi) / 7.0f : (hi - lo) / 15.0f);
  if (p.scale != 0.0f && !symmetric)
    p.zero = static_cast<uint8_t>(std::clamp(std::nearbyint(-lo / p.scale), 0.0f, 15.0f));
  return p;
}

uint8_t w4_quantize_value(float w, const W4GroupParams& p, bool symmetric) {
  if (p.scale == 0.0f) return 8;
  const float v = std::nearbyint(w / p.scale);  // round to nearest even
  return static_cast<uint8_t>(symmetric ? std::clamp(v, -8.0f, 7.0f) + 8.0f
                                        : std::clamp(v + float(p.zero), 0.0f, 15.0f));
}

void w4_rtn_quantize_row(const float* w, int64_t cols, int64_t group_cols, bool symmetric,
                         DType scale_dtype, const W4RtnRow& out) {
  for (int64_t g = 0; g < cols / group_cols; ++g) {
    const W4GroupParams p = w4_group_params(w + g * group_cols, group_cols, symmetric, scale_dtype);
    out.scale[g] = p.scale;
    out.zero[g] = p.zero;
    for (int64_t c = 0; c < group_cols; ++c)
      out.q[g * group_cols + c] = w4_quantize_value(w[g * group_cols + c], p, symmetric);
  }
}

}  // namespace xds

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

void w4_rtn_quantize_row(const float* w, int64_t cols, int64_t group_cols, bool symmetric,
                         DType scale_dtype, const W4RtnRow& out) {
  for (int64_t g = 0; g < cols / group_cols; ++g) {
    const float* wg = w + g * group_cols;
    uint8_t* qg = out.q + g * group_cols;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t c = 0; c < group_cols; ++c) {
      lo = std::min(lo, wg[c]);
      hi = std::max(hi, wg[c]);
    }
    const float s = round_to(scale_dtype, symmetric ? std::max(-lo, hi) / 7.0f : (hi - lo) / 15.0f);
    out.scale[g] = s;
    if (s == 0.0f) {
      std::fill(qg, qg + group_cols, uint8_t{8});
      out.zero[g] = 8;
      continue;
    }
    const float z = symmetric ? 8.0f : std::clamp(std::nearbyint(-lo / s), 0.0f, 15.0f);
    out.zero[g] = static_cast<uint8_t>(z);
    for (int64_t c = 0; c < group_cols; ++c) {
      const float v = std::nearbyint(wg[c] / s);  // round to nearest even
      qg[c] = static_cast<uint8_t>(symmetric ? std::clamp(v, -8.0f, 7.0f) + 8.0f
                                             : std::clamp(v + z, 0.0f, 15.0f));
    }
  }
}

}  // namespace xds

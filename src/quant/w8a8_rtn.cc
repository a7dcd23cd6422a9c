#include "quant/w8a8_rtn.h"

#include <algorithm>
#include <cmath>

namespace xds {

bool w8a8_head_or_kv_b(std::string_view name) {
  if (name == "lm_head.weight") return true;
  return name.starts_with("model.layers.") && (name.ends_with(".shared_head.head.weight") ||
                                               name.ends_with(".self_attn.kv_b_proj.weight"));
}

bool w8a8_rtn_target(std::string_view name, bool head_and_kv_b) {
  if (head_and_kv_b && w8a8_head_or_kv_b(name)) return true;
  if (!name.starts_with("model.layers.")) return false;
  static constexpr std::string_view kSuffixes[] = {".self_attn.q_a_proj.weight",
                                                   ".self_attn.q_b_proj.weight",
                                                   ".self_attn.q_proj.weight",
                                                   ".self_attn.kv_a_proj_with_mqa.weight",
                                                   ".self_attn.o_proj.weight",
                                                   ".gate_proj.weight",
                                                   ".up_proj.weight",
                                                   ".down_proj.weight"};
  for (std::string_view s : kSuffixes) {
    if (name.ends_with(s))
      return name.find(".mlp.") != std::string_view::npos ||
             name.find(".self_attn.") != std::string_view::npos;
  }
  return false;
}

std::vector<std::string> w8a8_rtn_ignore(bool head_and_kv_b) {
  if (head_and_kv_b) return {"re:.*mlp\\.gate$", "re:.*eh_proj$"};
  return {"lm_head", "re:.*mlp\\.gate$", "re:.*kv_b_proj$", "re:.*eh_proj$",
          "re:.*shared_head\\.head$"};
}

float rtn_quantize_row(const float* w, int64_t cols, DType scale_dtype, int8_t* q) {
  float amax = 0.0f;
  for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[c]));
  float s = amax / 127.0f;
  if (scale_dtype == DType::kBF16) s = bf16_to_f32(f32_to_bf16(s));
  if (scale_dtype == DType::kF16) s = f16_to_f32(f32_to_f16(s));
  if (s == 0.0f) {
    std::fill(q, q + cols, int8_t{0});
    return 0.0f;
  }
  for (int64_t c = 0; c < cols; ++c) {
    const float v = std::nearbyint(w[c] / s);  // round to nearest even (default mode)
    q[c] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return s;
}

}  // namespace xds

// The W8A8 rule: which linears are quantized, and round-to-nearest per output row, in the
// compressed-tensors layout the runtime loads (model/quant_config.h, model/int8_weights.h).
// The quantizer (quantize.h) and mkmodel --weights-int8 (random checkpoints, or an RTN copy
// of an existing one with --from) both write it.
//
// Quantized: every decoder layer's q_a_proj, q_b_proj, q_proj, kv_a_proj_with_mqa, o_proj
// and the gate_proj / up_proj / down_proj of its dense MLP, shared and routed experts.
// Kept in their dtype (the written `ignore` list): lm_head, the router gates, kv_b_proj,
// the MTP layers' eh_proj and shared_head.head.
// With head_and_kv_b (quantize / mkmodel --int8-head-and-kv-b) also quantized, and so
// dropped from `ignore`: lm_head, the MTP layers' shared_head.head and every kv_b_proj (the
// runtime multiplies them as W8A8 linears, kv_b_proj per head in the absorbed attention:
// model/int8_weights.h bind_int8_absorbed_heads). The router gates and eh_proj stay float.
//
// Per output row r of a weight W [rows, cols] (its values as the float checkpoint holds
// them):
//   scale[r] = dtype(absmax(W[r]) / 127)      rounded to the scale's stored dtype
//   q[r][c]  = clamp(rne(W[r][c] / scale[r]), -127, 127)   (0 where scale[r] is 0)
// so that W ≈ q · scale with the scale the checkpoint stores.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace xds {

// True for a weight ("....weight") the layout above quantizes.
bool w8a8_rtn_target(std::string_view weight_name, bool head_and_kv_b = false);

// True for the weights head_and_kv_b adds: lm_head.weight, <layer>.shared_head.head.weight,
// <layer>.self_attn.kv_b_proj.weight.
bool w8a8_head_or_kv_b(std::string_view weight_name);

// The `ignore` entries written with those weights.
std::vector<std::string> w8a8_rtn_ignore(bool head_and_kv_b = false);

// One row of cols values into q [cols]; returns the scale as stored (exactly representable
// in scale_dtype: BF16, F16 or F32).
float rtn_quantize_row(const float* w, int64_t cols, DType scale_dtype, int8_t* q);

}  // namespace xds

// Binding the linears of a compressed-tensors W8A8 checkpoint (model/quant_config.h).
//
// A quantized module `<m>` stores
//   <m>.weight        I8 [rows, cols]          (HF [out, in])
//   <m>.weight_scale  BF16/F16/F32 [rows, 1]   W[r][c] = weight[r][c] · scale[r]
// and is repacked once into the int8 kernels' panels (MatrixLayout::kInt8Panels: pairs of
// 16-row panels, fp32 scales, the vpdpbusd corrections; kernels/cpu/int8_linear.h) in the
// shared repack cache, as BF16 linears are into theirs (weights.h).
//
// Which modules are quantized is the config's decision (IntQuantization::quantizes), and
// the tensors must agree: a quantized module whose weight is not I8, or an ignored one whose
// weight is I8, fails with an error naming the file, the tensor and the config field.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "model/quant_config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tensor/matrix.h"

namespace xds {

// Element i of a quantization scale tensor (BF16, F16 or F32, widened exactly); an error
// naming the file, the tensor and the element when its dtype is another or the value is not
// finite and >= 0. Shared by the int8 and int4 binders.
Result<float> quant_scale_at(const TensorView& s, int64_t i);

// `<module>.weight` and `<module>.weight_scale` as int8 panels. Errors: a missing tensor, a
// wrong shape or dtype, a scale that is not finite and >= 0 (naming its row), cols above
// the kernels' exact range (kernels::kInt8MaxCols).
Result<MatrixRef> bind_int8_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows,
                                   int64_t cols, RepackCache& cache);

// The same tensors dequantized to F32 rows (weight · scale, one fp32 product each), for a
// quantized matrix the model slices by rows rather than multiplying whole (kv_b_proj).
Result<MatrixRef> bind_int8_as_f32_rows(const Checkpoint& ckpt, const std::string& module,
                                        int64_t rows, int64_t cols, RepackCache& cache);

// kv_b_proj's int8 tensors [H·(Dn+Dv), C] (W8A8: `<module>.weight` I8 + `.weight_scale`
// [rows, 1]) as the weight-absorbed heads (weights.h AbsorbedHeads), int8 panels in one
// repack file:
//   uk_t[h]: [C, Dn] = q_UK[h]ᵀ with unit row scales   (the scale is per column here)
//   uv[h]:   [Dv, C] = q_UV[h], row j scaled by s[h·(Dn+Dv) + Dn + j]
//   uk_scale [H, Dn] = s of the W_UK rows, folded into q_nope by the caller.
// Errors as bind_int8_linear's (a scale tensor of another shape names it).
Result<AbsorbedHeads> bind_int8_absorbed_heads(const Checkpoint& ckpt, const std::string& module,
                                               int64_t heads, int64_t dn, int64_t dv,
                                               int64_t lat, RepackCache& cache);

// The weight `weight_name` ("<module>.weight") of a Linear module under the W8A8 config:
// bind_int8_linear where the config quantizes the module, else bind_linear (its float
// dtype); a tensor that disagrees with the config is an error.
Result<MatrixRef> bind_w8a8_linear(const Checkpoint& ckpt, const IntQuantization& quant,
                                   const std::string& weight_name, int64_t rows, int64_t cols,
                                   RepackCache& cache);

// Whether the config quantizes the module of `weight_name` and its tensor is I8 (checked
// as bind_w8a8_linear checks it): for the matrices bound as rows (kv_b_proj).
Result<bool> w8a8_quantized(const Checkpoint& ckpt, const IntQuantization& quant,
                            const std::string& weight_name);

}  // namespace xds

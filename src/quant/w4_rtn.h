// Round to nearest per group of input columns, 4 bits: what mkmodel --weights-int4 writes
// (mkmodel/int4_checkpoint.h) into the layouts the runtime loads (model/int4_weights.h).
//
// Per row and group g of G columns (w the values as the float checkpoint holds them), the
// scale rounded to its stored dtype (BF16, F16 or F32) before the weights are quantized:
//   symmetric:  scale = dtype(absmax / 7),  q = clamp(rne(w / scale), -8, 7) + 8,  z = 8
//   asymmetric: lo = min(min w, 0), hi = max(max w, 0), scale = dtype((hi - lo) / 15),
//               z = clamp(rne(-lo / scale), 0, 15),  q = clamp(rne(w / scale) + z, 0, 15)
//   (scale 0, an all-zero group: q = z = 8)
// so that w ≈ scale · (q - z), q and z in 0..15 (the kernels' unsigned form).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace xds {

struct W4RtnRow {
  uint8_t* q;     // [cols], 0..15
  float* scale;   // [cols / G], as stored (exact in scale_dtype)
  uint8_t* zero;  // [cols / G], 0..15 (8 everywhere when symmetric)
};

// One group's parameters by the rule above, from its values w [group_cols].
struct W4GroupParams {
  float scale = 0.0f;  // as stored (exact in scale_dtype)
  uint8_t zero = 8;    // 0..15 (8 when symmetric or scale is 0)
};
W4GroupParams w4_group_params(const float* w, int64_t group_cols, bool symmetric,
                              DType scale_dtype);

// One value's 4-bit code (0..15) under p by the rule above (8 = z when p.scale is 0).
uint8_t w4_quantize_value(float w, const W4GroupParams& p, bool symmetric);

// One row of cols values (cols a multiple of group_cols).
void w4_rtn_quantize_row(const float* w, int64_t cols, int64_t group_cols, bool symmetric,
                         DType scale_dtype, const W4RtnRow& out);

}  // namespace xds

// Int4 weight matrices inside the model's MatrixRef (tensor/matrix.h, kInt4Panels): the view
// the int4 kernels take.
//
// linear_f32 / linear_bf16 / their _group and _serial forms (linear.h) run a kInt4Panels
// weight by its int8_activations flag (the checkpoint's input_activations, or the model's
// --activation-dtype int8):
//   W4A8  (true):  x quantized per token (int8_quant.h: from the fp32 rows, or from the bf16
//                  rows widened exactly), int4_linear (int32 group sums, fp32 scales)
//   W4A16 (false): int4_linear_f32 on fp32 rows, int4_linear_bf16 on bf16 rows
// (kernels/cpu/int4_linear.h).
#pragma once

#include "base/check.h"
#include "kernels/cpu/int4_linear.h"
#include "tensor/matrix.h"

namespace xds::kernels {

inline bool is_int4_matrix(const MatrixRef& w) {
  return w.layout == MatrixLayout::kInt4Panels;
}

// Int4 weights whose products quantize the activations per token (W4A8).
inline bool is_int4_a8_matrix(const MatrixRef& w) {
  return is_int4_matrix(w) && w.int8_activations;
}

inline Int4PanelsRef int4_panels_of(const MatrixRef& w) {
  XDS_CHECK(is_int4_matrix(w) && w.data != nullptr && w.scales != nullptr &&
                int4_group_cols_supported(w.group_cols),
            "int4_panels_of: not an int4 panel matrix");
  return {static_cast<const uint8_t*>(w.data), w.scales, w.zero, w.rows, w.cols, w.group_cols};
}

}  // namespace xds::kernels

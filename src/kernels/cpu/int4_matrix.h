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
//
// Permuted groups (activation reordering: a checkpoint's g_idx is not c / G; loaded by
// model/int4_weights.h): the panels hold the input columns sorted by group, panel column j
// being input column order[j], and the matrix keeps that order [cols] int32 in the field
// `correction` (which only kInt8Panels use otherwise; read it through int4_column_order). A
// weight with an order first gathers its input rows (x'[j] = x[order[j]]) into thread-local
// scratch: W4A16 the fp32 / bf16 values, W4A8 the int8 values after
// the per-token quantization (the token's scale is the same in any column order, and a byte
// is the cheapest element to move). That is n · k element copies against the n · k · rows / 2
// bytes of nibbles the product reads; no order costs one branch.
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

// The column order [cols] of a kInt4Panels matrix with permuted groups; null: the identity.
inline const int32_t* int4_column_order(const MatrixRef& w) {
  return is_int4_matrix(w) ? w.correction : nullptr;
}

// out[t][j] = x[t][order[j]] for t < n, j < k: x [n][ldx], out [n][k].
template <class T>
void gather_columns(const T* x, int64_t n, int64_t ldx, const int32_t* order, int64_t k, T* out) {
  for (int64_t t = 0; t < n; ++t) {
    const T* xt = x + t * ldx;
    T* ot = out + t * k;
    for (int64_t j = 0; j < k; ++j) ot[j] = xt[order[j]];
  }
}

// x's int8 rows gathered through order into out (resized to [x.rows, x.cols]), scales as
// they are.
inline Int8RowsRef gather_int8_columns(const Int8RowsRef& x, const int32_t* order, Int8Rows& out) {
  out.resize(x.rows, x.cols);
  gather_columns(x.q, x.rows, x.ld, order, x.cols, out.q.data());
  for (int64_t t = 0; t < x.rows; ++t) out.scale[t] = x.scale[t];
  return out.ref();
}

}  // namespace xds::kernels

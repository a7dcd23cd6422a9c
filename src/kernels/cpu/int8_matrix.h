// Int8 weight matrices inside the model's MatrixRef (tensor/matrix.h, kInt8Panels): the
// view the int8 kernels take, and the linear entry points for them.
//
// linear_f32 / linear_bf16 / their _group and _serial forms (linear.h) run a kInt8Panels
// weight as a W8A8 product: the activations quantized per token (int8_quant.h, from the
// fp32 rows, or from the bf16 rows widened exactly), int32 sums, per-channel × per-token
// scales, fp32 output (int8_linear.h). So every linear of a W8A8 checkpoint runs on the int8
// kernels wherever the model multiplies by it.
#pragma once

#include "base/check.h"
#include "kernels/cpu/int8_linear.h"
#include "tensor/matrix.h"

namespace xds::kernels {

inline bool is_int8_matrix(const MatrixRef& w) {
  return w.layout == MatrixLayout::kInt8Panels;
}

inline Int8PanelsRef int8_panels_of(const MatrixRef& w) {
  XDS_CHECK(is_int8_matrix(w) && w.scales != nullptr && w.correction != nullptr,
            "int8_panels_of: not an int8 panel matrix");
  return {static_cast<const int8_t*>(w.data), w.scales, w.correction, w.rows, w.cols};
}

// x [n][ldx] (the first cols of each row) quantized per token into out (resized to
// [n, cols]), rows split over the pool from 64 rows on: the bits of quantize_rows_int8.
inline void quantize_rows_int8_on_pool(const float* x, int64_t n, int64_t cols, int64_t ldx,
                                       Int8Rows& out, ThreadPool& pool) {
  out.resize(n, cols);
  auto rows = [&](int64_t t0, int64_t t1) {
    quantize_rows_int8(x + t0 * ldx, t1 - t0, cols, ldx,
                       {out.q.data() + t0 * cols, out.scale.data() + t0, cols});
  };
  if (n < 64) return rows(0, n);
  pool.parallel_for(n, [&](int64_t t0, int64_t t1, int) { rows(t0, t1); });
}

}  // namespace xds::kernels

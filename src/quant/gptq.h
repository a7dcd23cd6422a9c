// GPTQ for one linear layer, channel-wise symmetric INT8 (the W8A8 layout of
// quant/w8a8_rtn.h: one scale per output row).
//
// Given W [rows, cols] (float, row-major) and the Hessian H = Σ_t x_t x_tᵀ [cols, cols] of the
// layer's calibration inputs x_t [cols], GPTQ quantizes W column by column and spreads each
// column's rounding error over the columns not yet quantized so that ‖(W − Ŵ) Xᵀ‖² stays
// small (Frantar et al., "GPTQ", 2022):
//   scale[r]  = the RTN scale of the original row r (absmax / 127, rounded to scale_dtype)
//   H'        = H + damp · mean(diag H) · I,  dead columns (H_ii = 0) get H'_ii = 1
//   order     = columns by descending H_ii ("act order"), ties by index
//   U         = the upper Cholesky factor of H'⁻¹ (in `order`): H'⁻¹ = Uᵀ U
//   for each column j in order (in blocks of block_size):
//     q_j     = clamp(rne(w_j / scale), −127, 127);  e = (w_j − q_j · scale) / U_jj
//     w_k    −= e · U_jk   for every later column k
// The Cholesky factorizations and the inverse are LAPACK's (dpotrf / dpotri), in double.
//
// 4 bits in groups (gptq_w4_quantize; the pack-quantized layout of quant/w4_pack.h): the
// same sweep with each row's columns split into groups of G contiguous columns, each with
// its own scale (and zero point when asymmetric). The columns go in their natural order
// (no act order: the stored groups are contiguous, actorder "weight" without a g_idx, and
// a group's scale is fixed before any of its columns is rounded), and the blocks hold whole
// groups (block_size rounded down to a multiple of G, at least G), so that when the sweep
// reaches a group's first column all of the group's columns carry the error feedback of
// every column before them. There, per row:
//   scale, z  = quant/w4_rtn.h's rule on the group's current (error-updated) values
//   q_j       = that rule's code for w_j,  ŵ_j = scale · (q_j − z)
//   e         = (w_j − ŵ_j) / U_jj, spread over the later columns as above.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "quant/w4_pack.h"
#include "tensor/dtype.h"

namespace xds {

struct GptqOptions {
  double damp = 0.01;      // relative damping (of mean(diag H))
  int64_t block_size = 128;  // columns per lazy-update block
  bool act_order = true;   // columns by descending diag(H)
  DType scale_dtype = DType::kBF16;  // the stored scale's dtype (BF16, F16 or F32)
};

struct QuantizedLinear {
  std::vector<int8_t> q;     // [rows, cols]
  std::vector<float> scale;  // [rows], exactly representable in the scale dtype
};

// GPTQ as above. h is [cols, cols] (symmetric, only read). Errors: a shape mismatch, a
// Hessian LAPACK cannot factor even damped (naming the LAPACK info).
Result<QuantizedLinear> gptq_quantize(std::span<const float> w, int64_t rows, int64_t cols,
                                      std::span<const double> h, const GptqOptions& o);

// Round to nearest per row (quant/w8a8_rtn.h), for comparison and for linears without
// calibration data.
QuantizedLinear rtn_quantize(std::span<const float> w, int64_t rows, int64_t cols,
                             DType scale_dtype);

struct GptqW4Options {
  double damp = 0.01;        // relative damping (of mean(diag H))
  int64_t block_size = 128;  // columns per lazy-update block (rounded to whole groups)
  int64_t group_size = 128;  // G: columns per scale; cols must be a multiple
  bool symmetric = true;     // false: a zero point per group (quant/w4_rtn.h)
  DType scale_dtype = DType::kBF16;
};

// 4-bit grouped GPTQ as above. Errors: those of gptq_quantize, cols not a multiple of G.
Result<W4Linear> gptq_w4_quantize(std::span<const float> w, int64_t rows, int64_t cols,
                                  std::span<const double> h, const GptqW4Options& o);

// quant/w4_rtn.h's round to nearest on the original rows, the same groups.
W4Linear rtn_w4_quantize(std::span<const float> w, int64_t rows, int64_t cols, int64_t group,
                         bool symmetric, DType scale_dtype);

// The output error of q against w on the calibration inputs, relative:
//   ‖(W − Ŵ) Xᵀ‖²_F / ‖W Xᵀ‖²_F = tr(D H Dᵀ) / tr(W H Wᵀ),  D = W − Ŵ,  Ŵ = q · scale
// (0 when W Xᵀ is 0).
double relative_output_error(std::span<const float> w, int64_t rows, int64_t cols,
                             const QuantizedLinear& q, std::span<const double> h);
// The same with Ŵ = scale · (q − z) of 4-bit groups.
double relative_output_error(std::span<const float> w, int64_t rows, int64_t cols,
                             const W4Linear& q, std::span<const double> h);

}  // namespace xds

// Binding the linears of a 4-bit checkpoint (model/quant_config.h, layouts 2 and 3): the
// stored tensors unpacked to the kernels' source form (kernels::Int4Source: q [rows][cols]
// in 0..15, scale [rows][groups] fp32, zero [rows][groups] or none), checked, then repacked
// once into the int4 kernels' panels (MatrixLayout::kInt4Panels, kernels/cpu/int4_linear.h)
// in the shared repack cache, as int8 weights are (int8_weights.h).
//
// compressed-tensors pack-quantized, module <m> [rows = out, cols = in], G = group_size:
//   <m>.weight_packed      I32 [rows, cols/8]   value j of int32 [r][i] (bits 4j..4j+3) is
//                                               q[r][8i + j], stored as w + 8 (so 0..15)
//   <m>.weight_scale       BF16/F16/F32 [rows, cols/G]
//   <m>.weight_shape       I32/I64 [2] = [rows, cols]
//   <m>.weight_zero_point  I32 [ceil(rows/8), cols/G], asymmetric only: packed along the
//                          rows, value j of int32 [i][g] is z[8i + j][g] (+ 8, as the
//                          weights); absent or all 8 (zero 0) for symmetric weights
//   <m>.weight_g_idx       I32 [cols], actorder "group" only (optional)
//   W[r][c] = scale[r][g] · (q[r][c] - z[r][g]),  g = g_idx[c], or c / G without one
//   (z = 8 when symmetric)
//   (compressed-tensors pack_to_int32: packed_dim 1 for the weights, 0 for the zero points.)
//
// GPTQ (transformers / optimum / AutoGPTQ "gptq" v1 and GPTQModel "gptq_v2"):
//   <m>.qweight  I32 [cols/8, rows]           value j of int32 [i][r] is q[r][8i + j]
//   <m>.qzeros   I32 [cols/G, ceil(rows/8)]   value j of int32 [g][i] is the zero point of
//                                             row 8i + j in group g: z - 1 in v1 (so z = 0
//                                             cannot be stored; the value 15 is refused),
//                                             z in v2; symmetric weights have z = 8
//   <m>.scales   F16/BF16/F32 [cols/G, rows]
//   <m>.g_idx    I32 [cols] (optional)
//   W[r][c] = scales[g][r] · (q[r][c] - z[r][g]),  g = g_idx[c], or c / G without one
//
// g_idx (activation reordering: actorder "group", desc_act true) assigns each input column
// its group; as GPTQ and llm-compressor write it every group holds exactly G columns, and a
// g_idx that does not (or names a group outside 0..cols/G-1) is refused naming the tensor
// and the group. The identity (g_idx[c] = c / G, or no g_idx: actorder "weight" or none) binds
// as before. A permuted one binds the panels with the columns sorted by group (stable:
// sort_int4_columns_by_group), each group's scale and zero point unchanged, and keeps the
// order with the matrix (cols int32 beside the panels in the repack cache, read by
// kernels::int4_column_order); each product gathers its input rows through it first (kernels/cpu/int4_matrix.h):
// n · cols element copies per call, next to the rows · cols / 2 bytes of nibbles it reads.
// Matrices dequantized to F32 rows keep the checkpoint's column order.
//
// Errors name the file, the tensor and what was wrong (shape, dtype, a value out of range
// with its position). Thread-safety: as RepackCache (bind from one thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/int4_linear.h"
#include "model/quant_config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tensor/matrix.h"

namespace xds {

// One module's unpacked int4 weights (owning the buffers an Int4Source points into).
struct Int4Unpacked {
  std::vector<uint8_t> q;     // [rows][cols], 0..15
  std::vector<float> scale;   // [rows][groups]
  std::vector<uint8_t> zero;  // [rows][groups], 0..15; empty: symmetric (every zero point 8)
  int64_t rows = 0, cols = 0, group_cols = 0;
  // [cols] the group of each column (checked: each group exactly group_cols columns);
  // empty: the identity, column c in group c / group_cols. source() holds only the
  // identity: sort the columns first (sort_int4_columns_by_group).
  std::vector<int32_t> g_idx;

  kernels::Int4Source source() const {
    return {q.data(), scale.data(), zero.empty() ? nullptr : zero.data(), rows, cols, group_cols};
  }
  // W[r][c] as fp32: scale · (q - z) of c's group, one product.
  float weight(int64_t r, int64_t c) const;
};

// Permuted groups to the panels' form: reorders u's columns so that group g holds columns
// [g·G, (g+1)·G) (a stable sort of the columns by g_idx; scales and zero points stay, as they
// are per group) and clears u.g_idx. Returns the order [cols]: new column j is old column
// order[j], so that Σ_c W[r][c] · x[c] = Σ_j W'[r][j] · x[order[j]]. Empty (u unchanged)
// when u.g_idx is empty.
std::vector<int32_t> sort_int4_columns_by_group(Int4Unpacked& u);

// The module `module` ("model.layers.0.mlp.experts.3.up_proj") of shape [rows, cols] as the
// config's format stores it, unpacked and checked (see above).
Result<Int4Unpacked> unpack_int4_module(const Checkpoint& ckpt, const IntQuantization& quant,
                                        const std::string& module, int64_t rows, int64_t cols);

// The module as int4 panels (kInt4Panels; int8_activations set for W4A8).
Result<MatrixRef> bind_int4_linear(const Checkpoint& ckpt, const IntQuantization& quant,
                                   const std::string& module, int64_t rows, int64_t cols,
                                   RepackCache& cache);

// The same weights dequantized to F32 rows (kRows), for a matrix the model slices by rows
// (kv_b_proj).
Result<MatrixRef> bind_int4_as_f32_rows(const Checkpoint& ckpt, const IntQuantization& quant,
                                        const std::string& module, int64_t rows, int64_t cols,
                                        RepackCache& cache);

// Whether the module of `weight_name` ("<module>.weight") is quantized, the config and the
// tensors agreeing: compressed-tensors, quantized exactly where `ignore` does not list the
// module (then <m>.weight_packed present, <m>.weight absent; else the reverse); GPTQ,
// quantized where <m>.qweight is present. Disagreement is an error naming both.
Result<bool> int4_quantized(const Checkpoint& ckpt, const IntQuantization& quant,
                            const std::string& weight_name);

// The weight `weight_name` of a Linear module under any integer scheme: int8 panels (W8A8,
// int8_weights.h), int4 panels (W4A16, W4A8), or bind_linear's float panels where the
// module is not quantized. The module's own scheme decides (IntQuantization::scheme_of): in
// a mixed-precision 4-bit checkpoint, lm_head and kv_b_proj of the int8 group bind as int8.
Result<MatrixRef> bind_int_linear(const Checkpoint& ckpt, const IntQuantization& quant,
                                  const std::string& weight_name, int64_t rows, int64_t cols,
                                  RepackCache& cache);

// Whether the module of `weight_name` is quantized under any integer scheme (w8a8_quantized
// or int4_quantized), for the matrices bound as rows (kv_b_proj).
Result<bool> int_quantized(const Checkpoint& ckpt, const IntQuantization& quant,
                           const std::string& weight_name);

// A quantized matrix the model slices by rows, dequantized to F32 rows (bind_int8_as_f32_rows
// or bind_int4_as_f32_rows).
Result<MatrixRef> bind_int_as_f32_rows(const Checkpoint& ckpt, const IntQuantization& quant,
                                       const std::string& weight_name, int64_t rows, int64_t cols,
                                       RepackCache& cache);

}  // namespace xds

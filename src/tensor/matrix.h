// MatrixRef: a read-only weight matrix in one of the kernels' layouts.
//
// kRows: Hugging Face's own [out_features, in_features] row-major layout, so row r holds
// the weights of output r. `data` points into a read-only mmap of the checkpoint (BF16/F32
// used in place) or into a shared repack file (F16/FP8 checkpoints dequantized once to F32
// where a kernel needs rows: see kPanels16 for the linears).
//
// kPanels16 (BF16 or F16, or F8_E4M3 with block scales): the linear kernels' layout, written once
// into the shared repack cache. Rows are grouped in panels of 16 (the last one zero-padded),
// panels in pairs (an odd count gets a zero panel to close its last pair); a pair stores its
// two panels' columns interleaved, k-major, 16 elements of each per column:
//
//   panel p, column c: element [16] at data + ((p / 2) * cols + c) * 32 + (p % 2) * 16, where
//     element 2j   = W[16p + j][c]        (j = 0..7: the low half of 32-bit lane j)
//     element 2j+1 = W[16p + 8 + j][c]    (the high half of lane j)
//
// so one 32-byte BF16 load yields rows 16p..16p+7 as fp32 by `lane << 16` and rows
// 16p+8..16p+15 by `lane & 0xffff0000`, and a pair of panels is one sequential stream in
// which a 64-byte line holds a column of both (kernels/cpu/linear_panels.h): a tile of two
// panels reads one stream and runs two independent accumulations per token. F16 panels hold
// fp16 elements in the same places.
//
// F8_E4M3 panels (the published DeepSeek-V3 checkpoints' weights, 1 byte each) carry their
// block scales per panel: W[r][c] = e4m3(element) · scale_inv[r / block_rows][c / block_cols],
// with block_rows a multiple of 16 and block_cols a power of two, stored as
//
//   scales [stored_panels()][scale_blocks()] fp32: scales[p * scale_blocks() + (c >> scale_shift)]
//     = scale_inv of panel p's rows at column c, times 2^8
//
// (the kernel reads an element's sign, exponent and mantissa into an fp16's bits, which is
// its value times 2^-8; the product with the stored scale is the dequantized weight,
// rounded once, as a dequantization to F32 computes it).
//
// kInt8Panels (dtype kI8: W8A8 checkpoints, model/quant_config.h): int8 weights with one fp32
// scale per output row, in the int8 kernels' layout (kernels/cpu/int8_linear.h: pairs of
// 16-row panels, k in groups of 4, rows padded to a multiple of 32):
//   data [pairs][groups][2][16][4] int8, scales [stored rows] fp32 (W[r][c] = data · scales[r]),
//   correction [stored rows] int32 (-128 · Σ_c W[r][c], for the vpdpbusd path)
// written once at load into the repack cache. The linear kernels run them as W8A8 products
// (per-token int8 activations, int32 sums; kernels/cpu/int8_matrix.h).
//
// kInt4Panels (dtype kU8: W4A16 / W4A8 checkpoints, model/quant_config.h, model/int4_weights.h):
// 4-bit weights with one fp32 scale (and, asymmetric, one zero point) per output row and group
// of group_cols input columns, in the int4 kernels' layout (kernels/cpu/int4_linear.h):
//   data [pairs][cols / 4][64] uint8 (two rows' nibbles a byte; 32 rows a pair, padded),
//   scales [pairs][groups][32] fp32, zero [pairs][groups][32] uint8 or null (symmetric),
//   W[r][c] = scales(r, g) · (q(r, c) - zero(r, g)), g = c / group_cols (zero 8 when null)
// written once at load into the repack cache. int8_activations picks the product: true, W4A8
// (per-token int8 activations, int32 group sums); false, W4A16 (fp32 or bf16 activations).
// Permuted groups (a g_idx) keep their column order in `correction`: kernels/cpu/int4_matrix.h.
//
// Not owning; the Checkpoint / repack mapping outlives it.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace xds {

enum class MatrixLayout { kRows, kPanels16, kInt8Panels, kInt4Panels };

inline constexpr int64_t kPanelRows = 16;
inline constexpr int64_t kPairStride = 2 * kPanelRows;  // elements per column of a panel pair

struct MatrixRef {
  DType dtype = DType::kF32;  // kBF16 or kF32 (kPanels16: kBF16, kF16 or kF8E4M3)
  const void* data = nullptr;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features
  MatrixLayout layout = MatrixLayout::kRows;
  const float* scales = nullptr;        // F8_E4M3 panels only: see above
  int scale_shift = 0;                  // log2(block_cols) of those scales
  const int32_t* correction = nullptr;  // kInt8Panels: see above; kInt4Panels: int4_matrix.h
  // kInt4Panels only (scales above hold its [pairs][groups][32] fp32 scales): see above.
  const uint8_t* zero = nullptr;  // [pairs][groups][32], or null: symmetric
  int64_t group_cols = 0;         // G: 32, 64 or 128
  bool int8_activations = false;  // W4A8 (true) or W4A16

  int64_t scale_blocks() const { return (cols + (int64_t{1} << scale_shift) - 1) >> scale_shift; }

  int64_t row_bytes() const { return cols * dtype_size(dtype); }
  int64_t panels() const { return (rows + kPanelRows - 1) / kPanelRows; }
  // Panels stored (kPanels16): panels() rounded up to whole pairs.
  int64_t stored_panels() const { return (panels() + 1) / 2 * 2; }
  // kPanels16: the element offset of panel p's column c (see above).
  int64_t panel_column(int64_t p, int64_t c) const {
    return ((p >> 1) * cols + c) * kPairStride + (p & 1) * kPanelRows;
  }
  // Bytes of the payload, padding of the last panel and pair included.
  int64_t bytes() const {
    if (layout == MatrixLayout::kInt4Panels) return (rows + 31) / 32 * 16 * cols;
    if (layout == MatrixLayout::kInt8Panels) return (rows + 31) / 32 * 32 * ((cols + 3) / 4 * 4);
    return layout == MatrixLayout::kRows ? rows * row_bytes()
                                         : stored_panels() * kPanelRows * row_bytes();
  }
  // Bytes a product over the whole matrix reads: the payload and, for FP8 panels, their
  // scales (fp32, stored_panels() × scale_blocks()); int8 panels: their scales and
  // corrections (8 bytes a stored row); int4 panels: their scales and zero points (4 + 1
  // bytes a stored row and group).
  int64_t read_bytes() const {
    if (layout == MatrixLayout::kInt4Panels) {
      const int64_t groups = group_cols > 0 ? cols / group_cols : 0;
      return bytes() + (rows + 31) / 32 * 32 * groups * (4 + (zero != nullptr ? 1 : 0));
    }
    if (layout == MatrixLayout::kInt8Panels) return bytes() + (rows + 31) / 32 * 32 * 8;
    return bytes() + (scales != nullptr ? stored_panels() * scale_blocks() * int64_t{4} : 0);
  }
  // A view of rows [begin, begin + count); kRows only.
  MatrixRef row_slice(int64_t begin, int64_t count) const {
    return {dtype,  static_cast<const char*>(data) + begin * row_bytes(),
            count,  cols,
            layout, nullptr,
            0,      nullptr};
  }
};

}  // namespace xds

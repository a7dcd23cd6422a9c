// Linear layers over BF16, F16 or FP8 (F8_E4M3, block scales) weights in the kPanels16 layout
// (tensor/matrix.h): y[t][r] = Σ_c x[t][c] · W[r][c], fp32 accumulation.
//
//   x: [n, cols] fp32, row stride ldx
//   W: MatrixRef, kPanels16: ceil(rows/16) panels, each [cols][16] bf16, fp16 or e4m3 (rows
//      j and 8 + j side by side), in pairs whose columns interleave; FP8 with per-panel scales
//   y: [n, rows] fp32, row stride ldy
//
// An FP8 column is widened to fp32 and multiplied by its block's scale (one rounding: the
// weight a dequantization to F32 gives), then used as a BF16 column is; the sums are the
// same as over the F32 dequantized matrix, bit for bit. FP8 panels stream a byte per weight
// where that F32 matrix streams four.
//
// The micro-kernel is an outer product: per column c it loads the panel's 16 weights once
// (one 32-byte load, widened), broadcasts x[t][c] of up to 6 tokens (AVX2; 8 with AVX-512)
// and adds 16 × T products into T accumulators (two 8-lane halves each with AVX2). A tile
// takes both panels of a pair, one sequential stream with two independent sums per token
// (one panel's alone: each token's sum is one chain of fused multiply-adds, its latency the
// limit at one token), and the widening costs two instructions per 16 weights instead of
// four per 8.
//
// Summation order: every y[t][r] is Σ_c in ascending c, one fused multiply-add per c, in
// fp32, whatever n, the token blocking, the k blocking or the thread split: a token's
// result never depends on the other tokens of the call (batch invariance, bit-exact).
#pragma once

#include <cstdint>

#include "tensor/matrix.h"

namespace xds::kernels {

// Writes panels [panel_begin, panel_end) of the BF16 (or F16) row-major matrix w [rows, cols] into
// `out`, the whole kPanels16 buffer (stored_panels() * 16 * cols elements); rows past the end
// of the last panel are zero, and panel_end = panels() also writes the zero panel that closes
// an odd count's last pair.
void pack_panels16(const uint16_t* w, int64_t rows, int64_t cols, int64_t panel_begin,
                   int64_t panel_end, uint16_t* out);
// The same for F8_E4M3 bytes (the elements only; the scales: pack_fp8_panel_scales). The
// bytes must not be NaN (0x7f, 0xff): the kernel would read them as ±480 · scale, so the
// loader refuses such a tensor (bind_linear).
void pack_panels16_fp8(const uint8_t* w, int64_t rows, int64_t cols, int64_t panel_begin,
                       int64_t panel_end, uint8_t* out);
// Whether block scales can be stored as FP8 panels' scales (times 2^8 in fp32): each finite
// and below 2^120 in magnitude.
bool fp8_panel_scales_fit(const float* scale_inv, int64_t count);
// FP8 panels' scales (MatrixRef::scales) from scale_inv [ceil(rows / block_rows)]
// [ceil(cols / block_cols)]: out [stored_panels][ceil(cols / block_cols)] (the zero panel's
// scales 0). block_rows a multiple of 16, block_cols a power of two.
void pack_fp8_panel_scales(const float* scale_inv, int64_t rows, int64_t cols, int64_t block_rows,
                           int64_t block_cols, float* out);
// kPanels16 with BF16 or F16 elements, or F8_E4M3 ones with scales: what panels_linear
// takes. An F16 element is widened exactly (vcvtph2ps) and used as a BF16 one is: the sums
// are those over the F32 matrix an F16 checkpoint converts to, bit for bit.
bool is_panel_matrix(const MatrixRef& w);

// The instruction set of the micro-kernel (panel_tiles.h): AVX-512 where the build targets
// it (-march=native on a CPU that has it), else AVX2. Both give the same bits; the choice
// can be forced for tests and A/B benchmarks (process-wide; set it before any call runs).
enum class PanelIsa { kAvx2, kAvx512 };
bool panel_isa_available(PanelIsa isa);
PanelIsa panel_isa();
void set_panel_isa(PanelIsa isa);  // fails on an instruction set this build lacks
const char* panel_isa_name(PanelIsa isa);

// y[:, 16 p_begin .. min(rows, 16 p_end)) for all n tokens, on the calling thread. The range
// is of whole pairs: p_begin even, p_end even or panels() (checked).
void panels_linear(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                   int64_t p_end, float* y, int64_t ldy);

// bf16 activations (x: [n, cols] bf16, row stride ldx) against BF16 panels with the
// AVX512-BF16 dot product vdpbf16ps, two columns per instruction (linear_panels_dot.cc):
// y[:, 16 p_begin .. min(rows, 16 p_end)) on the calling thread (whole pairs, as
// panels_linear). Every product is exact in
// fp32 as in panels_linear on the widened x; the sums differ in rounding (pairs of columns
// per addition, denormals flushed to zero). Batch-invariant, bit for bit. Only where
// panels_dot_available() (built with AVX512_BF16).
bool panels_dot_available();
// Whether linear_bf16 runs w on this kernel: BF16 panels, panels_dot_available(), and the
// AVX-512 panel ISA selected (forcing AVX2 for an A/B run widens x instead).
bool panels_dot_for(const MatrixRef& w);
void panels_linear_bf16(const uint16_t* x, int64_t n, int64_t ldx, const MatrixRef& w,
                        int64_t p_begin, int64_t p_end, float* y, int64_t ldy);

// The wide path (AVX-512, wide_path_for(n, w)): each block of 256 columns of two panels
// is widened to fp32 once and read by every tile of up to 12 tokens, the tokens packed
// column by column per tile (xp, n × cols floats: tile i's tb tokens as [cols][tb] at
// xp + first token × cols). panels_linear packs on its own; a caller that splits one
// product over threads packs once (pack_token_tiles, tiles split among the threads) and
// runs panels_linear_packed on each share of the panels. Same sums, same order, same bits.
// From 128 tokens (panel_driver.h kWideMinTokens) and 256 rows, on AVX-512:
// packing x costs about one product of x with 16 rows, so a router of 64 rows runs slower on
// the wide path (its packing of 512 prompt tokens takes as long as its FMAs).
bool wide_path_for(int64_t n, const MatrixRef& w);
int64_t token_tile_count(int64_t n);
void pack_token_tiles(const float* x, int64_t n, int64_t ldx, int64_t cols, int64_t tile_begin,
                      int64_t tile_end, float* xp);
void panels_linear_packed(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin,
                          int64_t p_end, float* y, int64_t ldy);

}  // namespace xds::kernels

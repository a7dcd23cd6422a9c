// 4-bit weight linear layers: int4 weights (compressed-tensors `pack-quantized`, GPTQ) with
// one fp32 scale per group of G input columns per output row and, for asymmetric
// checkpoints, one zero point per group; against int8 activations (W4A8) or fp32 / bf16
// activations (W4A16). Decode is bound by the weight bytes read: these kernels stream half
// the bytes of the int8 ones (int8_linear.h), the nibbles unpacked in registers inside the
// dot product.
//
// The weights, as a checkpoint gives them (Int4Source, row-major, unpacked):
//   q     [n][k]      uint8 in 0..15 (one nibble each)
//   scale [n][k / G]  fp32 sw[r][g]
//   zero  [n][k / G]  uint8 in 0..15, or null: symmetric (every zero point 8, q = w + 8 for
//                     signed w in -8..7)
//   so that the weight is sw[r][g] · (q[r][c] - z[r][g]) for column c of group g = c / G.
//   G in {32, 64, 128}; k a multiple of G (check_int4_source).
//
// The packed layout (Int4PanelsRef; pack_int4_panels), what the kernels stream:
//
//   rows in pairs of 16-row panels (32 rows; the last pair padded with q = 0, z = 0,
//   scale 0), k in quads of 4 columns; pair p, quad u is one 64-byte line at
//   data + (p · k/4 + u) · 64:
//     byte 4 j + i = q[32 p + j][4 u + i] | q[32 p + 16 + j][4 u + i] << 4   (j < 16, i < 4)
//   so a line holds 32 rows × 4 columns, the low nibbles rows 0-15 of the pair and the
//   high nibbles rows 16-31, each row's 4 columns in one 32-bit lane: `line & 0x0f` and
//   `(line >> 4) & 0x0f` are the two vpdpbusd operands (u8) against the same broadcast of
//   x's 4 columns; AVX2 takes the line's two 32-byte halves (half h: rows 8h..8h+7 in the
//   low nibbles, rows 16+8h..16+8h+7 in the high ones). A pair is one sequential stream of
//   16 · k bytes (k/2 per row).
//   scale [pairs][groups][32] fp32: scale[(p · groups + g) · 32 + j] = sw[32 p + j][g]
//   zero  [pairs][groups][32] uint8, the same order (null for symmetric weights)
//   The metadata read per row and group: 4 bytes (+ 1 with zero points), beside G/2 bytes
//   of nibbles (12.5% more at G = 32 symmetric, 3% at G = 128).
//
// W4A8, int4_linear: x is Int8RowsRef [m, k] (int8_quant.h: per-token scale sx [m]).
//   s[t][r][g] = Σ_{c in g} xq[t][c] · (q[r][c] - z[r][g])     int32, exact
//   f = 0;  for g = 0, 1, ...:  f = fma(float(s[t][r][g]), sw[r][g], f)    (fp32, fused)
//   y[t][r] = f · sx[t]                                            (fp32; bf16 rounds it)
// |s| <= 128 · 15 · G <= 245760 < 2^24, so float(s) is exact, and every path computes the
// same s and runs the same IEEE operations on it: the outputs are bit-identical across
// instruction sets, token counts, blockings and thread splits (batch invariance).
//
// W4A16, int4_linear_f32 / int4_linear_bf16 (bf16 x widened exactly to fp32 first):
//   p[t][r][g] = Σ_{c in g} x[t][c] · (q[r][c] - 8)     fp32 (the products exact)
//   p += (8 - z[r][g]) · xs[t][g]   (asymmetric only; xs = Σ_{c in g} x[t][c] in double,
//                                    rounded to fp32; one fma)
//   f = 0;  for g: f = fma(p, sw[r][g], f);   y[t][r] = f
// The order of p's additions is the path's own (AVX-512: two partial sums per row, columns
// 4u+0,1 and 4u+2,3, added at the group's end; AVX2 the same on 8 lanes; scalar one chain),
// so the outputs differ across instruction sets within the fp32 rounding bound
//   |y - exact| <= (G + groups + 3) · 2^-24 · Σ_g |sw| · (Σ_c |x_c| |q_c - 8| + |8 - z| Σ_c |x_c|)
// (to first order), and are bit-identical across token counts and thread splits on one path.
//
// The instruction sets, selected at run time among those built and supported by the CPU
// (int4_isa(); set_int4_isa forces one, for tests and A/B runs):
//
//   avx512_vnni  W4A8: the nibbles split by vpand / vpsrlw+vpand, vpdpbusd (q as u8 × xq as
//                s8; 4 products of <= 15 · 128 per lane, never saturating) into int32
//                accumulators that start at -z · Σ xq (vpmaddwd of the zero-extended zero
//                points by the broadcast -Σ xq); per group vcvtdq2ps and vfmadd into f
//                (kept in an L1 buffer). Up to 6 tokens × 32 rows per pass.
//                W4A16: vpermps of a 16-entry table (q - 8 as fp32) indexed by the line
//                shifted right by 4 · (2 i + half) (vpermps reads the index's low 4 bits
//                only), vfmadd by x broadcast. Up to 4 tokens × 32 rows per pass.
//   avx2         W4A8: vpmaddubsw (q u8 × xq s8: pair sums <= 2 · 15 · 128 = 3840, never
//                saturating), the int16 sums of up to 8 lines added (<= 30720 < 2^15), then
//                vpmaddwd by ones into int32. W4A16: shift, and, vpsubd 8, vcvtdq2ps, FMA.
//                Half a pair (16 rows) at a time, up to 2 tokens per pass.
//   scalar       plain loops over the same layout (the reference path).
//
// Threads: the pool's threads take chunks of pairs from a shared counter (as int8_linear);
// below ~256K multiply-adds a call runs on the calling thread.
// Thread-safety: one call per pool at a time (ThreadPool); the _on_thread forms may run
// concurrently on different threads (each uses thread-local scratch only).
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/int8_quant.h"

namespace xds::kernels {

inline constexpr int64_t kInt4PairRows = 32;

enum class Int4Isa { kScalar, kAvx2, kAvx512Vnni };
// Built into this binary and supported by the CPU it runs on (scalar and AVX2 always).
bool int4_isa_available(Int4Isa isa);
// The selected path: by default the fastest available. Process-wide; set before calls run.
Int4Isa int4_isa();
void set_int4_isa(Int4Isa isa);  // fails on an unavailable one
const char* int4_isa_name(Int4Isa isa);

// The group widths the kernels take.
inline bool int4_group_cols_supported(int64_t g) {
  return g == 32 || g == 64 || g == 128;
}

// Unpacked int4 weights as a checkpoint gives them (not owning; the layout above).
struct Int4Source {
  const uint8_t* q = nullptr;     // [rows][cols], each in 0..15
  const float* scale = nullptr;   // [rows][cols / group_cols]
  const uint8_t* zero = nullptr;  // [rows][cols / group_cols] in 0..15, or null: symmetric
  int64_t rows = 0;               // n, output rows
  int64_t cols = 0;               // k, a multiple of group_cols
  int64_t group_cols = 0;         // G: 32, 64 or 128
};

// InvalidArgument naming the first problem: an unsupported G, k not a multiple of G, null
// buffers, a q or zero point above 15 (with its row and column). For a loader to call
// before packing (pack_int4_panels aborts on the same conditions).
Status check_int4_source(const Int4Source& w);

// Repacked int4 weights (not owning; see the layout above).
struct Int4PanelsRef {
  const uint8_t* data = nullptr;  // [pairs][cols / 4][64], 64-byte aligned
  const float* scale = nullptr;   // [pairs][groups][32]
  const uint8_t* zero = nullptr;  // [pairs][groups][32], or null: symmetric
  int64_t rows = 0;               // n
  int64_t cols = 0;               // k
  int64_t group_cols = 0;         // G

  int64_t groups() const { return cols / group_cols; }
  int64_t pairs() const { return (rows + kInt4PairRows - 1) / kInt4PairRows; }
  int64_t stored_rows() const { return pairs() * kInt4PairRows; }
  int64_t data_bytes() const { return pairs() * cols * 16; }
  int64_t scale_count() const { return stored_rows() * groups(); }  // also the zero bytes
  // Every byte a product reads of the weights: nibbles, scales, zero points.
  int64_t bytes_read() const {
    return data_bytes() + scale_count() * (4 + (zero != nullptr ? 1 : 0));
  }
};

// Where pack_int4_panels writes (not owning; sizes as in Int4PanelsRef). zero null for a
// symmetric source.
struct Int4PanelsOut {
  uint8_t* data = nullptr;
  float* scale = nullptr;
  uint8_t* zero = nullptr;
};

// Repacks pairs [pair_begin, pair_end) of w into out, the whole matrix's buffers (a loader
// may split the pairs over threads); the last pair's padding rows as above. Aborts with
// check_int4_source's message on bad shapes and on a value above 15 in its rows; out.zero
// must be set exactly when w.zero is.
void pack_int4_panels(const Int4Source& w, int64_t pair_begin, int64_t pair_end,
                      const Int4PanelsOut& out);

// Owning repacked weights (tests, benchmarks; the loader keeps its own mapping).
class Int4Panels {
 public:
  static Int4Panels pack(const Int4Source& w);
  Int4PanelsRef ref() const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;  // 64-byte aligned
  std::unique_ptr<float[]> scale_;
  std::unique_ptr<uint8_t[]> zero_;  // null: symmetric
  int64_t rows_ = 0, cols_ = 0, group_cols_ = 0;
};

// W4A8: y = x · Wᵀ as above (x.cols == w.cols), on the pool. y as in int8_linear.h: exactly
// one of f32 and bf16 set, [m][ld].
void int4_linear(const Int8RowsRef& x, const Int4PanelsRef& w, const Int8Output& y,
                 ThreadPool& pool);
// The same on the calling thread (one routed expert per pool thread, say).
void int4_linear_on_thread(const Int8RowsRef& x, const Int4PanelsRef& w, const Int8Output& y);

// W4A16: fp32 activations x [m][ldx] (the first w.cols of each row), as above.
void int4_linear_f32(const float* x, int64_t m, int64_t ldx, const Int4PanelsRef& w,
                     const Int8Output& y, ThreadPool& pool);
void int4_linear_f32_on_thread(const float* x, int64_t m, int64_t ldx, const Int4PanelsRef& w,
                               const Int8Output& y);
// bf16 activations x [m][ldx]: widened exactly into fp32 scratch, then int4_linear_f32's
// bits.
void int4_linear_bf16(const uint16_t* x, int64_t m, int64_t ldx, const Int4PanelsRef& w,
                      const Int8Output& y, ThreadPool& pool);

}  // namespace xds::kernels

// W8A8 linear layers: int8 activations (per-token scales) against int8 weights (per-output-
// row scales), int32 accumulation, the scales applied once per output:
//
//   y[t][r] = (float(Σ_c xq[t][c] · wq[r][c]) · sw[r]) · sx[t]     (fp32, in this order)
//
//   x:  Int8RowsRef [m, k]  (int8_quant.h: per-token symmetric, scale sx [m])
//   W:  Int8PanelsRef [n, k], repacked once at load by pack_int8_panels (scale sw [n])
//   y:  Int8Output [m, n], fp32 or bf16 (round to nearest even), row stride ld
//
// The weight layout (what the kernels stream; k padded with zeros to a multiple of 4):
//
//   rows in pairs of 16-row panels (32 rows; the last pair zero-padded), k in groups of 4
//   columns; pair q, group g is 128 bytes at data + (q · groups + g) · 128:
//     byte 64 h + 4 j + i = W[32 q + 16 h + j][4 g + i]   (h: panel of the pair, j < 16, i < 4)
//   so each 64-byte line is one vpdpbusd operand: 16 int32 lanes, lane j = row j's 4 bytes,
//   and a pair is one sequential stream of groups (as the BF16 panels: tensor/matrix.h).
//   scale      [stored_rows] fp32: sw[r], 0 on padded rows
//   correction [stored_rows] int32: -128 · Σ_c W[r][c] (mod 2^32), for the VNNI path below
//
// The instruction sets, selected at run time among those built and supported by the CPU
// (int8_isa(); set_int8_isa forces one, for tests and A/B runs):
//
//   avx512_vnni  vpdpbusd takes unsigned × signed bytes: the activations are offset to
//                u8 = xq + 128 (an xor with 0x80), so each lane sums (xq + 128) · w; its
//                accumulators start at the row's correction, -128 · Σ w, which leaves
//                exactly Σ xq · w. Up to 12 tokens × 32 rows of accumulators per pass.
//   avx2         exact widening: bytes sign-extended to int16 (vpmovsxbw), vpmaddwd adds
//                two int16 products into each int32 lane (never vpmaddubsw, whose int16
//                sums saturate), vpaddd accumulates; lane pairs summed at the end.
//   scalar       a plain loop over the same layout (the reference path).
//
// Exactness: every path computes the same int32 Σ_c xq · w, exactly, for any int8 values
// and k <= kInt8MaxCols (|Σ| <= 128 · 128 · k < 2^31; intermediate sums wrap modulo 2^32
// and end exact). The fp32 epilogue (the scales, SiLU, the bf16 rounding) is one routine
// shared by every path, so the outputs are bit-identical across instruction sets, token
// counts, blockings and thread splits: a token's result never depends on the other tokens
// of the call (batch invariance).
//
// Threads: the pool's threads take chunks of pairs from a shared counter (as linear.cc does
// for the BF16 panels); below ~256K multiply-adds a call runs on the calling thread.
// Thread-safety: one call per pool at a time (ThreadPool); the _on_thread forms may run
// concurrently on different threads (each uses thread-local scratch only).
#pragma once

#include <cstdint>
#include <memory>

#include "base/thread_pool.h"
#include "kernels/cpu/int8_quant.h"

namespace xds::kernels {

// The largest k for which every int8 product sum is exact in int32 (128 · 128 · k < 2^31).
inline constexpr int64_t kInt8MaxCols = 131071;

enum class Int8Isa { kScalar, kAvx2, kAvx512Vnni };
// Built into this binary and supported by the CPU it runs on (scalar and AVX2 always).
bool int8_isa_available(Int8Isa isa);
// The selected path: by default the fastest available. Process-wide; set before calls run.
Int8Isa int8_isa();
void set_int8_isa(Int8Isa isa);  // fails on an unavailable one
const char* int8_isa_name(Int8Isa isa);

// Repacked int8 weights (not owning; see the layout above).
struct Int8PanelsRef {
  const int8_t* data = nullptr;         // [pairs][groups][2][16][4], 64-byte aligned
  const float* scale = nullptr;         // [stored_rows]
  const int32_t* correction = nullptr;  // [stored_rows]
  int64_t rows = 0;                     // n, output rows
  int64_t cols = 0;                     // k

  int64_t groups() const { return (cols + 3) / 4; }
  int64_t pairs() const { return (rows + 31) / 32; }
  int64_t stored_rows() const { return pairs() * 32; }
  int64_t data_bytes() const { return pairs() * groups() * 128; }
};

// Where pack_int8_panels writes (not owning; sizes as in Int8PanelsRef).
struct Int8PanelsOut {
  int8_t* data = nullptr;
  float* scale = nullptr;
  int32_t* correction = nullptr;
};

// Repacks pairs [pair_begin, pair_end) of the quantized weights w [rows, cols] (per-row
// scales; int8_quant.h) into out, the whole matrix's buffers (the loader may split the
// pairs over threads); the last pair's padding rows are zero. cols <= kInt8MaxCols.
void pack_int8_panels(const Int8RowsRef& w, int64_t pair_begin, int64_t pair_end,
                      const Int8PanelsOut& out);

// Owning repacked weights (tests, benchmarks; the loader keeps its own mapping).
class Int8Panels {
 public:
  static Int8Panels pack(const Int8RowsRef& w);
  Int8PanelsRef ref() const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<int8_t, Free> data_;  // 64-byte aligned
  std::unique_ptr<float[]> scale_;
  std::unique_ptr<int32_t[]> correction_;
  int64_t rows_ = 0, cols_ = 0;
};

// The output rows: exactly one of f32 and bf16 set, [m][ld].
struct Int8Output {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  int64_t ld = 0;
};

// y = x · Wᵀ as above (x.cols == w.cols), on the pool.
void int8_linear(const Int8RowsRef& x, const Int8PanelsRef& w, const Int8Output& y,
                 ThreadPool& pool);
// The same on the calling thread (one routed expert per pool thread, say).
void int8_linear_on_thread(const Int8RowsRef& x, const Int8PanelsRef& w, const Int8Output& y);
// fp32 activations x [m][ldx], quantized per token inside the call (the threads quantize
// the rows, then multiply): the bits of quantize_rows_int8 followed by int8_linear.
void int8_linear_f32(const float* x, int64_t m, int64_t ldx, const Int8PanelsRef& w,
                     const Int8Output& y, ThreadPool& pool);

// The exact int32 sums alone, sums [m][ld] = Σ_c xq[t][c] · W[r][c] (r < w.rows), on the
// calling thread with the selected path: for tests, and for a caller with an epilogue of
// its own.
void int8_linear_sums_on_thread(const Int8RowsRef& x, const Int8PanelsRef& w, int32_t* sums,
                                int64_t ld);

// The first half of a gated MLP in one kernel: per output row r of the intermediate width,
//   g = (float(Σ xq · gate[r]) · sw_gate[r]) · sx,  u likewise with up,
//   h[t][r] = g / (1 + exp(-g)) · u    (exp: vec_math.h, the kernels' SiLU)
// gate and up of the same shape; each pair of gate rows runs beside the same pair of up
// rows on the same thread, in one parallel region (x packed once). hq, when set, also receives h
// quantized per token (int8, per-token scales: the down projection's input), the bits of
// quantize_rows_int8 on the written h (its f32 or its bf16 values).
struct Int8GateUp {
  const Int8PanelsRef* gate = nullptr;
  const Int8PanelsRef* up = nullptr;
};
void int8_gate_up(const Int8RowsRef& x, const Int8GateUp& w, const Int8Output& h,
                  const Int8RowsOut* hq, ThreadPool& pool);
void int8_gate_up_on_thread(const Int8RowsRef& x, const Int8GateUp& w, const Int8Output& h,
                            const Int8RowsOut* hq);

}  // namespace xds::kernels

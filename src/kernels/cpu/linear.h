// Linear layers: y = x · Wᵀ with fp32 accumulation.
//
//   x: [n, k] activations, row stride ldx (elements)
//   W: MatrixRef [rows, k]: BF16 or F32 in the Hugging Face [out, in] layout (kRows), or
//      BF16 panels (kPanels16, the loaded model's linears: kernels/cpu/linear_panels.h)
//   y: [n, rows] fp32, row stride ldy
//   W8A8 weights (kInt8Panels) run on the int8 kernels in every entry point below: x
//   quantized per token (from fp32, or from the bf16 values widened exactly), int32 sums,
//   the scales (kernels/cpu/int8_matrix.h, int8_linear.h). Int4 weights (kInt4Panels) run on
//   the int4 kernels: W4A8 (x quantized per token as for W8A8) or W4A16 (x as given), as the
//   matrix says (kernels/cpu/int4_matrix.h, int4_linear.h).
//
// Work is split across the pool by output rows, so every thread streams its own slice of
// W exactly once per call while the activations stay in cache (decode is memory-bound on
// W). kRows: tokens are register-blocked 4 at a time, rows 3-8 at a time. kPanels16: an
// outer-product kernel, 6 tokens × 16 rows per tile. matmul_nn_accumulate takes kRows only.
#pragma once

#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "tensor/matrix.h"

namespace xds::kernels {

// Row-major weights (F32 from FP8/F16 checkpoints, or XDS_WEIGHT_LAYOUT=rows): from this
// many tokens on, W is widened to fp32 and multiplied by OpenBLAS sgemm (bench/linear);
// below, the register-blocked tile kernel reads W directly. BF16 panels (the default) always
// run the panel kernel: it matched or beat widen + sgemm at every n measured (n = 16-512,
// docs/design/cpu_kernels.md), and needs neither the widened copy nor sgemm's packing.
inline constexpr int64_t kSgemmMinTokens = 64;

// fp32 activations (the reference mode): W is converted to fp32 on the fly. Results of a
// token do not depend on the other tokens of the call for panel weights at any n, and for
// row-major weights as long as n < sgemm_min_tokens.
void linear_f32(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                ThreadPool& pool, int64_t sgemm_min_tokens = kSgemmMinTokens);

// One product of a group that shares its input (linear_f32_group): y = x · wᵀ.
struct LinearOutput {
  const MatrixRef* w;
  float* y;
  int64_t ldy;
};

// linear_f32 of several weights with the same input x (all with k = x's columns), in one
// parallel region where they are all panel weights: x's token tiles packed once, the chunks
// of all the weights' panels taken from one counter (q_a and kv_a; an MLP's gate and up).
// Separately, each product packed x again and ended on a barrier with its own tail. Every y
// is what linear_f32 gives for its weight: the same bits.
void linear_f32_group(const float* x, int64_t n, int64_t ldx, std::span<const LinearOutput> outs,
                      ThreadPool& pool);

// bf16 activations (the fast mode's rounding point): x holds bf16 values. BF16 panels on
// AVX512_BF16 (with the AVX-512 panel ISA): the vdpbf16ps kernel, two columns per
// instruction (panels_linear_bf16; faster than the fp32 panels from 16 tokens, level at one:
// docs/benchmarks.md, "bench_linear"). Otherwise x is widened exactly to fp32 and the products and sums are as in
// linear_f32. Either way a token's result does not depend on the other tokens of the call.
void linear_bf16(const uint16_t* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                 int64_t ldy, ThreadPool& pool);

// linear_bf16 of several weights with the same x in one parallel region where they all take
// the dot-product kernel (the chunks of all of them from one counter); each y as linear_bf16
// gives it.
void linear_bf16_group(const uint16_t* x, int64_t n, int64_t ldx,
                       std::span<const LinearOutput> outs, ThreadPool& pool);

// linear_f32 on the calling thread with the tile kernel only (never sgemm): for the many
// small products inside a parallel region (attention over one cache block).
void linear_f32_serial(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy);

// Sets OpenBLAS to one thread (once per process): every sgemm of the kernels runs inside a
// pool thread that owns its slice of the work.
void use_single_threaded_blas();

// Rounds fp32 to bf16 (nearest even): dst[i] = bf16(src[i]) for i < count.
void round_to_bf16(const float* src, int64_t count, uint16_t* dst);

// y[n, cols] += x[n, rows] · W[rows, cols] for a (small) W block, single thread:
// used by absorbed MLA, where a head's W_UK block multiplies from the left. From
// kNnSgemmMinTokens tokens on, W is widened and multiplied by sgemm (rounding differs);
// below, a token's sums do not depend on the other tokens.
inline constexpr int64_t kNnSgemmMinTokens = 16;
void matmul_nn_accumulate(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                          int64_t ldy);

}  // namespace xds::kernels

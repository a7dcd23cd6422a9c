// The gated MLP of a W8A8 checkpoint on the int8 kernels (kernels/cpu/int8_linear.h):
//
//   x  [n, D]  int8 rows, per-token scales (quantized once by the caller)
//   h  [n, I]  = silu(x · W_gateᵀ) ⊙ (x · W_upᵀ)   one kernel (int8_gate_up), fp32, and in
//              the same pass quantized per token to int8 for the down projection
//   out[n, D]  = h · W_downᵀ                       int8 products, fp32 rows (stride ldo)
//
// Thread-safety: a scratch per caller; with pool null everything runs on the calling thread
// (a routed expert inside GroupedExperts' parallel region).
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/int8_quant.h"
#include "model/moe_weights.h"

namespace xds {

// True when gate, up and down are all int8 panel matrices.
bool is_int8_mlp(const MlpWeights& w);

struct Int8MlpScratch {
  kernels::Int8Rows x;   // [n, D] the caller's quantized input (optional use)
  kernels::Int8Rows hq;  // [n, I]
  std::vector<float> h;  // [n, I]
};

void int8_mlp(const MlpWeights& w, const kernels::Int8RowsRef& x, float* out, int64_t ldo,
              Int8MlpScratch& s, ThreadPool* pool);

}  // namespace xds

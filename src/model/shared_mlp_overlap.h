// SharedMlpOverlap: a MoE layer's shared experts as OverlapWork (moe_exchange.h), so that
// the experts' exchange runs them between routed experts.
//
// At decode the routed experts are memory-bound (each reads its weights for a token or
// two) and the shared MLP is compute-bound (its weights serve the whole batch). Run one
// after the other, the memory bus idles during the shared MLP; in slices between routed
// experts, one thread's slice runs while the other streams an expert.
//
//   gate = x · W_gateᵀ, up = x · W_upᵀ       [n, I]   slices of panels, any order
//   h = silu(gate) ⊙ up                       [n, I]   by whoever finishes the last of those
//   out = h · W_downᵀ                         [n, D]   slices of panels, once h is ready
//
// Every output is computed by panels_linear over whole panels, as the plain MLP computes
// it, so the result is bit-identical to running the MLP after the routed experts.
// Panel weights only (supported()). With `bf16` (the fast mode's products) x and h are
// rounded to bf16 and each slice runs the kernel linear_bf16 runs on the whole matrix
// (panels_linear_bf16, or panels_linear on the widened bf16 values): again bit-identical to
// the plain MLP of that mode.
// Thread-safety: run_slice may be called from many threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "model/moe_weights.h"
#include "model/moe_exchange.h"

namespace xds {

class SharedMlpOverlap final : public OverlapWork {
 public:
  // Whether `mlp` can run in slices: all three matrices panels (BF16, F16 or FP8). (With
  // `bf16` each slice runs the kernel linear_bf16 runs on its matrix: the dot-product kernel
  // where the matrix takes it (panels_dot_for), else the fp32 one on the widened values.)
  static bool supported(const MlpWeights& mlp);

  // Work per slice by default: a small fraction of one routed expert's time, so that the
  // slices spread over the experts' phase.
  static constexpr double kSliceFlops = 3e6;

  // x: [n, D] (row stride D); gate, up: scratch [n, I] each; out: [n, D] (overwritten).
  // A slice is about slice_flops of work, at least one panel.
  SharedMlpOverlap(const MlpWeights& mlp, const float* x, int64_t n, float* gate, float* up,
                   float* out, double slice_flops = kSliceFlops, bool bf16 = false);

  int64_t slices() const { return gu_slices_ + down_slices_; }

  Slice run_slice() override;

 private:
  static int64_t panels_per_slice(int64_t n, int64_t cols, double slice_flops);

  const MlpWeights& mlp_;
  const float* x_;
  int64_t n_, d_, width_;
  float *gate_, *up_, *out_;
  int64_t gu_step_, down_step_;  // panels per slice
  int64_t gate_slices_, gu_slices_, down_slices_;
  std::atomic<int64_t> next_gu_{0}, done_gu_{0}, next_down_{0};
  std::atomic<bool> h_ready_{false};
  bool bf16_;
  // The rows of panels [p0, p1) of w for all n_ tokens, written to y: from x [n_, k] (fp32
  // products), or with bf16_ from its bf16 rounding: x_bf16 on the dot-product kernel where
  // w takes it, else the same values widened, x_rounded, on the fp32 kernel.
  void product(const float* x, const uint16_t* x_bf16, const float* x_rounded, int64_t k,
               const MatrixRef& w, int64_t p0, int64_t p1, float* y, int64_t ldy) const;
  std::vector<uint16_t> x_bf16_, h_bf16_;    // with bf16: x [n, D] and h [n, I] rounded
  std::vector<float> x_rounded_, h_rounded_;  // the same widened, where a matrix takes fp32
};

}  // namespace xds

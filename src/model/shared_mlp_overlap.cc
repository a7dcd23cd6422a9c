#include "model/shared_mlp_overlap.h"

#include <algorithm>

#include "base/check.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/ops.h"
#include "tensor/dtype.h"

namespace xds {

namespace {

// dst = src widened to fp32 (exact): the operand of a slice whose matrix takes the fp32
// kernel in the bf16 mode.
void widen_bf16(const std::vector<uint16_t>& src, std::vector<float>& dst) {
  dst.resize(src.size());
  for (size_t i = 0; i < src.size(); ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace

bool SharedMlpOverlap::supported(const MlpWeights& mlp) {
  return kernels::is_panel_matrix(mlp.gate_proj) && kernels::is_panel_matrix(mlp.up_proj) &&
         kernels::is_panel_matrix(mlp.down_proj);
}

int64_t SharedMlpOverlap::panels_per_slice(int64_t n, int64_t cols, double slice_flops) {
  const double per_panel = 2.0 * static_cast<double>(kPanelRows * cols * n);
  // Whole pairs of panels (the kernels' unit: tensor/matrix.h).
  return std::max<int64_t>(2, static_cast<int64_t>(slice_flops / per_panel) / 2 * 2);
}

SharedMlpOverlap::SharedMlpOverlap(const MlpWeights& mlp, const float* x, int64_t n, float* gate,
                                   float* up, float* out, double slice_flops, bool bf16)
    : mlp_(mlp),
      x_(x),
      n_(n),
      d_(mlp.gate_proj.cols),
      width_(mlp.gate_proj.rows),
      gate_(gate),
      up_(up),
      out_(out),
      gu_step_(panels_per_slice(n, d_, slice_flops)),
      down_step_(panels_per_slice(n, width_, slice_flops)),
      bf16_(bf16) {
  XDS_CHECK(supported(mlp), "SharedMlpOverlap: weights its slices cannot run");
  if (bf16_) {
    x_bf16_.resize(static_cast<size_t>(n_ * d_));
    kernels::round_to_bf16(x_, n_ * d_, x_bf16_.data());
    if (!kernels::panels_dot_for(mlp.gate_proj) || !kernels::panels_dot_for(mlp.up_proj))
      widen_bf16(x_bf16_, x_rounded_);
    h_bf16_.resize(static_cast<size_t>(n_ * width_));
  }
  auto slices = [](int64_t panels, int64_t step) { return (panels + step - 1) / step; };
  gate_slices_ = slices(mlp.gate_proj.panels(), gu_step_);
  gu_slices_ = gate_slices_ + slices(mlp.up_proj.panels(), gu_step_);
  down_slices_ = slices(mlp.down_proj.panels(), down_step_);
}

OverlapWork::Slice SharedMlpOverlap::run_slice() {
  const int64_t i = next_gu_.fetch_add(1, std::memory_order_relaxed);
  if (i < gu_slices_) {
    const bool is_gate = i < gate_slices_;
    const MatrixRef& w = is_gate ? mlp_.gate_proj : mlp_.up_proj;
    const int64_t p0 = (is_gate ? i : i - gate_slices_) * gu_step_;
    product(x_, x_bf16_.data(), x_rounded_.data(), d_, w, p0, std::min(w.panels(), p0 + gu_step_),
            is_gate ? gate_ : up_, width_);
    // The thread that completes the last gate/up slice forms h for the down slices; the
    // acq_rel count makes every other slice's writes visible to it.
    if (done_gu_.fetch_add(1, std::memory_order_acq_rel) + 1 == gu_slices_) {
      kernels::silu_mul(gate_, up_, n_ * width_, gate_);
      if (bf16_) {
        kernels::round_to_bf16(gate_, n_ * width_, h_bf16_.data());
        if (!kernels::panels_dot_for(mlp_.down_proj)) widen_bf16(h_bf16_, h_rounded_);
      }
      h_ready_.store(true, std::memory_order_release);
    }
    return Slice::kRan;
  }
  if (!h_ready_.load(std::memory_order_acquire)) return Slice::kNotReady;
  const int64_t j = next_down_.fetch_add(1, std::memory_order_relaxed);
  if (j >= down_slices_) return Slice::kDone;
  const int64_t p0 = j * down_step_;
  product(gate_, h_bf16_.data(), h_rounded_.data(), width_, mlp_.down_proj, p0,
          std::min(mlp_.down_proj.panels(), p0 + down_step_), out_, d_);
  return Slice::kRan;
}

void SharedMlpOverlap::product(const float* x, const uint16_t* x_bf16, const float* x_rounded,
                               int64_t k, const MatrixRef& w, int64_t p0, int64_t p1, float* y,
                               int64_t ldy) const {
  if (bf16_ && kernels::panels_dot_for(w))
    return kernels::panels_linear_bf16(x_bf16, n_, k, w, p0, p1, y, ldy);
  kernels::panels_linear(bf16_ ? x_rounded : x, n_, k, w, p0, p1, y, ldy);
}

}  // namespace xds

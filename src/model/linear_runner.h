// LinearRunner: y = x · Wᵀ in the model's compute dtype.
//
// kF32: kernels::linear_f32. kBF16: the inputs are first rounded to bf16 (the stated
// rounding point of the fast mode), then kernels::linear_bf16. Int8 weights (W8A8
// checkpoints) take the fp32 rows in both modes: quantized per token, int8 products
// (kernels/cpu/int8_matrix.h), the same integer arithmetic whatever the compute dtype; so do
// W4A8 int4 weights. W4A16 int4 weights take the mode's rows (fp32, or rounded to bf16).
// Thread-safety: one caller at a time (owns a bf16 scratch buffer).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "model/compute_dtype.h"
#include "tensor/matrix.h"

namespace xds {

// Sees the input rows x [n, w.cols] (row stride ldx) of every linear a runner computes,
// before the product, on the calling thread (offline calibration: quant/calibration.h).
using LinearObserver =
    std::function<void(const MatrixRef& w, const float* x, int64_t n, int64_t ldx)>;

class LinearRunner {
 public:
  LinearRunner(ComputeDType compute, ThreadPool& pool) : compute_(compute), pool_(pool) {}
  // x: [n, w.cols] (row stride ldx) -> y: [n, w.rows] (row stride ldy).
  void operator()(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                  int64_t ldy);
  // Several weights against the same x (kernels::linear_f32_group; in bf16, x rounded once):
  // each y as operator() gives it.
  void group(const float* x, int64_t n, int64_t ldx, std::span<const kernels::LinearOutput> outs);
  ThreadPool& pool() { return pool_; }
  // Every later call shows its inputs to `observer` first (empty: none, the default).
  void set_observer(LinearObserver observer) { observer_ = std::move(observer); }
  ComputeDType compute() const { return compute_; }

 private:
  ComputeDType compute_;
  ThreadPool& pool_;
  std::vector<uint16_t> bf16_;  // [n, w.cols]
  LinearObserver observer_;
};

}  // namespace xds

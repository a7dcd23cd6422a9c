#include "model/linear_runner.h"

#include "base/check.h"
#include "kernels/cpu/int4_matrix.h"
#include "kernels/cpu/int8_matrix.h"
#include "kernels/cpu/linear.h"

namespace xds {
namespace {

bool quantizes_activations(const MatrixRef& w) {
  return kernels::is_int8_matrix(w) || kernels::is_int4_a8_matrix(w);
}

}  // namespace

void LinearRunner::operator()(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                              int64_t ldy) {
  if (observer_) observer_(w, x, n, ldx);
  // Int8 weights (and W4A8 int4 ones) quantize the fp32 rows per token in either mode (the
  // same arithmetic).
  if (compute_ == ComputeDType::kF32 || quantizes_activations(w)) {
    kernels::linear_f32(x, n, ldx, w, y, ldy, pool_);
    return;
  }
  const int64_t k = w.cols;
  if (bf16_.size() < static_cast<size_t>(n * k)) bf16_.resize(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) kernels::round_to_bf16(x + t * ldx, k, bf16_.data() + t * k);
  kernels::linear_bf16(bf16_.data(), n, k, w, y, ldy, pool_);
}

void LinearRunner::group(const float* x, int64_t n, int64_t ldx,
                         std::span<const kernels::LinearOutput> outs) {
  if (outs.empty()) return;
  if (observer_) {
    for (const kernels::LinearOutput& o : outs) observer_(*o.w, x, n, ldx);
  }
  if (compute_ == ComputeDType::kF32 || quantizes_activations(*outs[0].w)) {
    kernels::linear_f32_group(x, n, ldx, outs, pool_);
    return;
  }
  const int64_t k = outs[0].w->cols;
  if (bf16_.size() < static_cast<size_t>(n * k)) bf16_.resize(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) kernels::round_to_bf16(x + t * ldx, k, bf16_.data() + t * k);
  kernels::linear_bf16_group(bf16_.data(), n, k, outs, pool_);
}

}  // namespace xds

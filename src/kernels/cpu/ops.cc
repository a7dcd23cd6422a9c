#include "kernels/cpu/ops.h"

#include <cmath>
#include <limits>

namespace xds::kernels {

void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* y) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sum) / n + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax_inplace(float* x, int64_t n) {
  if (n == 0) return;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope_interleaved(float* x, int64_t dim, const float* cos_sin) {
  for (int64_t i = 0; i < dim; i += 2) {
    const float a = x[i], b = x[i + 1];
    const float c = cos_sin[i], s = cos_sin[i + 1];
    x[i] = a * c - b * s;
    x[i + 1] = b * c + a * s;
  }
}

void axpy(float a, const float* x, int64_t n, float* y) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace xds::kernels

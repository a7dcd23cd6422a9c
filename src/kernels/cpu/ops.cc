#include "kernels/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/vec_math.h"

namespace xds::kernels {

void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* y) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sum) / n + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax_inplace(float* x, int64_t n) {
  if (n == 0) return;
  const float mx = scale_and_max(x, n, 1.0f);  // x * 1 is exact: the max only
  const float inv = 1.0f / exp_shifted_sum(x, n, mx);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float exp_shifted_sum(float* x, int64_t n, float shift) {
  int64_t i = 0;
  __m256 acc = _mm256_setzero_ps();
  const __m256 sh = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  for (; i < n; ++i) sum += x[i] = std::exp(x[i] - shift);
  return sum;
}

float scale_and_max(float* x, int64_t n, float scale) {
  int64_t i = 0;
  float mx = -std::numeric_limits<float>::infinity();
  if (n >= 8) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 m = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sc);
      _mm256_storeu_ps(x + i, v);
      m = _mm256_max_ps(m, v);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    for (float v : lanes) mx = std::max(mx, v);
  }
  for (; i < n; ++i) mx = std::max(mx, x[i] *= scale);
  return mx;
}

void rope_interleaved(float* x, int64_t dim, const float* cos_sin) {
  for (int64_t i = 0; i < dim; i += 2) {
    const float a = x[i], b = x[i + 1];
    const float c = cos_sin[i], s = cos_sin[i + 1];
    x[i] = a * c - b * s;
    x[i + 1] = b * c + a * s;
  }
}

}  // namespace xds::kernels

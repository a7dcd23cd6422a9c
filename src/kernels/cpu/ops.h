// Element-wise and row-wise kernels on fp32 activations (single thread; callers split rows).
#pragma once

#include <cstdint>
#include <span>

namespace xds::kernels {

// y[i] = x[i] / sqrt(mean(x²) + eps) * w[i], i < n. y may alias x.
void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* y);

// out[i] = silu(gate[i]) * up[i], silu(z) = z / (1 + e^-z). out may alias gate.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// In-place numerically stable softmax over x[0..n): scale_and_max, exp_shifted_sum, 1/sum.
void softmax_inplace(float* x, int64_t n);

// The pieces of a softmax, for kernels that keep running statistics (online softmax):
// x[i] *= scale for i < n, returning the largest result (n >= 1)...
float scale_and_max(float* x, int64_t n, float scale);
// ...and x[i] = exp(x[i] - shift) for i < n (AVX2 exp, vec_math.h), returning Σ x[i]
// (8 partial sums, then the lanes in order).
float exp_shifted_sum(float* x, int64_t n, float shift);

// Rotates interleaved pairs of x[0..dim): (x[2i], x[2i+1]) by angle with cos/sin
// tables cos_sin[2i] = cos, cos_sin[2i+1] = sin (already scaled by the YaRN mscale).
void rope_interleaved(float* x, int64_t dim, const float* cos_sin);

}  // namespace xds::kernels

// What the int8 kernel tests check against, written apart from the kernels: exact sums over
// the row-major int8 matrices in int64 (no packing, no offsets, no vectors), the documented
// fp32 epilogue in scalar code, and the instruction sets to run each check on.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/int8_quant.h"
#include "kernels/cpu/vec_math.h"

namespace xds::kernels {

// Every int8 path this binary can run here (scalar, AVX2, and AVX512_VNNI where available).
inline std::vector<Int8Isa> available_int8_isas() {
  std::vector<Int8Isa> isas;
  for (const Int8Isa isa : {Int8Isa::kScalar, Int8Isa::kAvx2, Int8Isa::kAvx512Vnni})
    if (int8_isa_available(isa)) isas.push_back(isa);
  return isas;
}

// Restores the default int8 path when a test ends.
struct Int8IsaGuard {
  Int8Isa saved = int8_isa();
  ~Int8IsaGuard() { set_int8_isa(saved); }
};

// Random int8 rows in [lo, hi] with positive scales of assorted magnitudes.
inline Int8Rows random_int8_rows(int64_t rows, int64_t cols, std::mt19937& rng, int lo = -128,
                                 int hi = 127) {
  Int8Rows r;
  r.resize(rows, cols);
  std::uniform_int_distribution<int> v(lo, hi);
  std::uniform_real_distribution<float> mant(0.5f, 2.0f);
  std::uniform_int_distribution<int> ex(-12, 2);
  for (auto& q : r.q) q = static_cast<int8_t>(v(rng));
  for (auto& s : r.scale) s = std::ldexp(mant(rng), ex(rng));
  return r;
}

// sums[t][r] = Σ_c x[t][c] · w[r][c], exactly (int64).
inline std::vector<int64_t> reference_sums(const Int8Rows& x, const Int8Rows& w) {
  std::vector<int64_t> s(static_cast<size_t>(x.rows * w.rows));
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      int64_t acc = 0;
      for (int64_t c = 0; c < x.cols; ++c)
        acc += int64_t{x.q[t * x.cols + c]} * int64_t{w.q[r * w.cols + c]};
      s[t * w.rows + r] = acc;
    }
  return s;
}

// The documented epilogue: (float(sum) · sw) · sx, each product rounded to fp32.
inline float reference_output(int64_t sum, float sw, float sx) {
  const float a = static_cast<float>(static_cast<int32_t>(sum));
  const float b = a * sw;
  return b * sx;
}

// The kernels' exp (vec_math.h) on one value: lane 0 of the 8-lane form.
inline float kernel_exp(float v) {
  return _mm256_cvtss_f32(exp_avx2(_mm256_set1_ps(v)));
}

// h = g / (1 + exp(-g)) · u, each step rounded to fp32 (ops.h silu_mul's vector steps).
inline float reference_silu_mul(float g, float u) {
  const float e = kernel_exp(0.0f - g);
  const float d = 1.0f + e;
  const float q = g / d;
  return q * u;
}

}  // namespace xds::kernels

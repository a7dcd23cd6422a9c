// The few vector operations the attention tiles use, for one instruction set each, so that
// one template serves 8-lane AVX2 and 16-lane AVX-512 registers:
//   V zero(), V load(const float*), void store(float*, V), V set1(float), V fma(a, b, c)
//   (a · b + c, one rounding), kLanes.
#pragma once

#include <immintrin.h>

namespace xds::kernels {

#define XDS_SIMD_INLINE __attribute__((always_inline)) static inline

struct Avx2Ops {
  using V = __m256;
  static constexpr int kLanes = 8;
  XDS_SIMD_INLINE V zero() { return _mm256_setzero_ps(); }
  XDS_SIMD_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  XDS_SIMD_INLINE void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  XDS_SIMD_INLINE V set1(float f) { return _mm256_set1_ps(f); }
  XDS_SIMD_INLINE V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};

#if defined(__AVX512F__)
struct Avx512Ops {
  using V = __m512;
  static constexpr int kLanes = 16;
  XDS_SIMD_INLINE V zero() { return _mm512_setzero_ps(); }
  XDS_SIMD_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  XDS_SIMD_INLINE void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  XDS_SIMD_INLINE V set1(float f) { return _mm512_set1_ps(f); }
  XDS_SIMD_INLINE V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

#undef XDS_SIMD_INLINE

}  // namespace xds::kernels

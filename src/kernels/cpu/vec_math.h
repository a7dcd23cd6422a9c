// Vectorised exp for AVX2 (8 floats at a time) and AVX-512 (16), for softmax and SiLU.
//
// exp(x) = 2^n · e^r with n = round(x / ln 2) and r = x - n·ln 2 (ln 2 split in a high part
// exact in float and a low part, so r is exact to ~1 ulp), |r| <= ln 2 / 2; e^r by its
// Taylor polynomial to degree 7 (truncation error < 2e-8 relative on that interval) in
// Horner form with FMA; 2^n put straight into the exponent bits. x is clamped to
// [-87, 88.3]: below, the result stays the normal 1.6e-38 instead of underflowing (every
// use adds it to something >= 1 or multiplies it by a bounded value); above, 2^n would overflow (n
// = 128 from x = 88.38 on). Accuracy: within 2 ulp of std::exp on [-87, 88.3]
// (tests/unit/kernels/vec_math_test.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace xds::kernels {

// The constants of both widths (one set, so that they stay the same bits).
namespace exp_detail {
inline constexpr float kLow = -87.0f, kHigh = 88.3f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2High = 0.693359375f;    // 9 significant bits: n · kLn2High exact
inline constexpr float kLn2Low = -2.12194440e-4f;  // ln 2 - kLn2High
// e^r = Σ r^k / k!, k = 7 .. 0, in Horner order.
inline constexpr float kTaylor[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                     1.0f / 6,    0.5f,       1.0f,       1.0f};
}  // namespace exp_detail

inline __m256 exp_avx2(__m256 x) {
  using namespace exp_detail;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kLow)), _mm256_set1_ps(kHigh));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kTaylor[0]);
#pragma GCC unroll 8
  for (int k = 1; k < 8; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kTaylor[k]));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

#if defined(__AVX512F__)
// The same steps on 16 lanes: every lane gives the bits exp_avx2 gives (the zero-masking
// forms with a full mask are the plain instructions; GCC 12's plain intrinsics trip
// -Wmaybe-uninitialized).
inline __m512 exp_avx512(__m512 x) {
  using namespace exp_detail;
  constexpr __mmask16 kAll = 0xffff;
  x = _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, x, _mm512_set1_ps(kLow)),
                          _mm512_set1_ps(kHigh));
  const __m512 n = _mm512_maskz_roundscale_ps(kAll, _mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kTaylor[0]);
#pragma GCC unroll 8
  for (int k = 1; k < 8; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kTaylor[k]));
  const __m512i e =
      _mm512_maskz_add_epi32(kAll, _mm512_maskz_cvtps_epi32(kAll, n), _mm512_set1_epi32(127));
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, e, 23)));
}
#endif

}  // namespace xds::kernels

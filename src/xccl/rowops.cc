#include "xccl/rowops.h"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace xds::xccl {

float quantize_row_int8(const uint16_t* x, int hidden, std::byte* q) {
  float amax = 0.f;
  for (int h = 0; h < hidden; ++h) amax = std::max(amax, std::fabs(bf16_to_float(x[h])));
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = 1.f / scale;
  auto* qi = reinterpret_cast<int8_t*>(q);
  for (int h = 0; h < hidden; ++h) {
    float v = std::nearbyint(bf16_to_float(x[h]) * inv);
    qi[h] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
  }
  std::memcpy(q + int8_row_bytes(hidden) - 4, &scale, 4);
  return scale;
}

void dequantize_row_int8(const std::byte* q, int hidden, uint16_t* out) {
  float scale;
  std::memcpy(&scale, q + int8_row_bytes(hidden) - 4, 4);
  const auto* qi = reinterpret_cast<const int8_t*>(q);
  for (int h = 0; h < hidden; ++h) out[h] = float_to_bf16(float(qi[h]) * scale);
}

#if defined(__AVX2__) && defined(__FMA__)
namespace {
inline __m256 load8_bf16(const uint16_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}
// float_to_bf16 on 8 lanes: round to nearest even, NaN stays a quiet NaN.
inline __m128i round8_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i bias =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), _mm256_castps_si256(nan));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
}  // namespace
#endif

void weighted_sum_bf16(const uint16_t* const* rows, const float* w, int n, int hidden,
                       uint16_t* out) {
  int h = 0;
#if defined(__AVX2__) && defined(__FMA__)
  // 16 columns at a time, every row's term accumulated in registers (one pass over the rows).
  for (; h + 16 <= hidden; h += 16) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __m256 wj = _mm256_set1_ps(w[j]);
      a0 = _mm256_fmadd_ps(wj, load8_bf16(rows[j] + h), a0);
      a1 = _mm256_fmadd_ps(wj, load8_bf16(rows[j] + h + 8), a1);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + h), round8_bf16(a0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + h + 8), round8_bf16(a1));
  }
#endif
  for (; h < hidden; ++h) {
    float acc = 0.f;
    for (int j = 0; j < n; ++j) acc = std::fma(w[j], bf16_to_float(rows[j][h]), acc);
    out[h] = float_to_bf16(acc);
  }
}

void axpy_bf16(float w, const uint16_t* x, int hidden, float* acc) {
  for (int h = 0; h < hidden; ++h) acc[h] += w * bf16_to_float(x[h]);
}

void add_bf16(const uint16_t* x, int hidden, float* acc) {
  for (int h = 0; h < hidden; ++h) acc[h] += bf16_to_float(x[h]);
}

void store_bf16(const float* acc, int hidden, uint16_t* out) {
  for (int h = 0; h < hidden; ++h) out[h] = float_to_bf16(acc[h]);
}

}  // namespace xds::xccl

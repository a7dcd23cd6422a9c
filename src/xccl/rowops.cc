#include "xccl/rowops.h"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace xds::xccl {

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

namespace {
// Scalar forms: the reference semantics, and the tails of the vector loops.
float absmax_scalar(const uint16_t* x, int b, int e, float amax) {
  for (int h = b; h < e; ++h) amax = std::max(amax, std::fabs(bf16_to_float(x[h])));
  return amax;
}
void quantize_scalar(const uint16_t* x, int b, int e, float inv, int8_t* q) {
  for (int h = b; h < e; ++h) {
    const float v = std::nearbyint(bf16_to_float(x[h]) * inv);
    q[h] = static_cast<int8_t>(v > 127.f ? 127.f : v >= -127.f ? v : -127.f);  // NaN -> -127
  }
}
void dequantize_scalar(const int8_t* q, int b, int e, float scale, uint16_t* out) {
  for (int h = b; h < e; ++h) out[h] = float_to_bf16(float(q[h]) * scale);
}
}  // namespace

// INT8 kernels, 32 columns per step (AVX2), bit-identical to the scalar forms:
//  * |x| of a bf16 is its bit pattern & 0x7fff, whose integer order is the magnitude order; a
//    row with a NaN (pattern > 0x7f80) takes the scalar path (std::max skips NaNs).
//  * With a finite 1 / scale, |x * inv| <= 127 (+ rounding), so cvtps (round to nearest even,
//    the default mode, as nearbyint) needs no clamp before it; the saturating packs and the
//    max with -127 keep the scalar's clamp for anything else.
//  * bf16 -> f32 is an unpack with zeros: unpacklo/hi take columns [0-3 | 8-11] and
//    [4-7 | 12-15] of 16, and packs_epi32 of the two restores [0-7 | 8-15] per 128-bit lane.
//  * dequantize: float(q) * scale rounded to bf16 to nearest even; q * scale is finite for a
//    finite scale, so the NaN case of round8_bf16 is not needed (a non-finite scale: scalar).
float quantize_row_int8(const uint16_t* x, int hidden, std::byte* q) {
  auto* qi = reinterpret_cast<int8_t*>(q);
  int h = 0;
  float amax = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  {
    __m256i m = _mm256_setzero_si256();
    const __m256i abs_mask = _mm256_set1_epi16(0x7fff);
    for (; h + 16 <= hidden; h += 16)
      m = _mm256_max_epu16(
          m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + h)),
                              abs_mask));
    __m128i m8 = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 8));
    m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 4));
    m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 2));
    const uint16_t bits = uint16_t(_mm_extract_epi16(m8, 0));
    if (bits > 0x7f80) h = 0;  // a NaN: the scalar scan below skips it
    else amax = bf16_to_float(bits);
  }
#endif
  amax = absmax_scalar(x, h, hidden, amax);
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = 1.f / scale;
  h = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (std::isfinite(inv) && std::isfinite(amax)) {
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i zero = _mm256_setzero_si256(), lo = _mm256_set1_epi8(-127);
    auto q16 = [&](int at) {  // 16 columns -> 16 int16, order [0-7 | 8-15]
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + at));
      const __m256 a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
      const __m256 b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
      return _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(a, vinv)),
                                _mm256_cvtps_epi32(_mm256_mul_ps(b, vinv)));
    };
    for (; h + 32 <= hidden; h += 32) {
      // packs_epi16 of [0-7 | 8-15] and [16-23 | 24-31]: 8-byte groups 0, 2, 1, 3.
      const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(q16(h), q16(h + 16)),
                                                     _MM_SHUFFLE(3, 1, 2, 0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qi + h), _mm256_max_epi8(bytes, lo));
    }
  }
#endif
  quantize_scalar(x, h, hidden, inv, qi);
  std::memcpy(q + int8_row_bytes(hidden) - 4, &scale, 4);
  return scale;
}

void dequantize_row_int8(const std::byte* q, int hidden, uint16_t* out) {
  float scale;
  std::memcpy(&scale, q + int8_row_bytes(hidden) - 4, 4);
  const auto* qi = reinterpret_cast<const int8_t*>(q);
  int h = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (std::isfinite(scale)) {
    const __m256 vs = _mm256_set1_ps(scale);
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
    auto bf8 = [&](const int8_t* p) {  // 8 int8 -> 8 rounded f32 patterns, bf16 in bits 16-31
      const __m256i u = _mm256_castps_si256(_mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
          vs));
      const __m256i bias = _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
      return _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    };
    for (; h + 32 <= hidden; h += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(qi + h) + 512, _MM_HINT_T0);  // a peer's line
      for (int k = 0; k < 32; k += 16) {
        // packus of [0-3 | 4-7] and [8-11 | 12-15]: 8-byte groups 0, 2, 1, 3.
        const __m256i w = _mm256_packus_epi32(bf8(qi + h + k), bf8(qi + h + k + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + h + k),
                            _mm256_permute4x64_epi64(w, _MM_SHUFFLE(3, 1, 2, 0)));
      }
    }
  }
#endif
  dequantize_scalar(qi, h, hidden, scale, out);
}

void weighted_sum_bf16(const uint16_t* const* rows, const float* w, int n, int hidden,
                       uint16_t* out) {
  int h = 0;
#if defined(__AVX2__) && defined(__FMA__)
  // 64 columns at a time, every row's term accumulated in registers (one pass over the rows).
  // A 32-bit lane of 2 bf16 [even | odd << 16] gives both as f32 without a widening shuffle:
  // even = lane << 16, odd = lane & 0xffff0000. Same FMAs in the same order as the scalar form
  // per column, so the result is identical; rounding re-packs [even >> 16 | odd & 0xffff0000].
  const __m256i hi_mask = _mm256_set1_epi32(int(0xffff0000u));
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
  // f32 lanes -> bf16 bit patterns in bits 16-31, round to nearest even (finite and infinite
  // lanes; a NaN would carry into the sign, so a step with a NaN takes the scalar path).
  auto round_hi = [&](__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    return _mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
  };
  for (; h + 64 <= hidden; h += 64) {
    __m256 e[4], o[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) e[k] = o[k] = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __m256 wj = _mm256_set1_ps(w[j]);
      const auto* p = reinterpret_cast<const __m256i*>(rows[j] + h);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_loadu_si256(p + k);
        e[k] = _mm256_fmadd_ps(wj, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), e[k]);
        o[k] = _mm256_fmadd_ps(wj, _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask)), o[k]);
      }
    }
    // Any NaN among the 64 sums? (unordered compare of pairs: NaN if either is)
    const __m256 nan = _mm256_or_ps(
        _mm256_or_ps(_mm256_cmp_ps(e[0], e[1], _CMP_UNORD_Q), _mm256_cmp_ps(e[2], e[3], _CMP_UNORD_Q)),
        _mm256_or_ps(_mm256_cmp_ps(o[0], o[1], _CMP_UNORD_Q), _mm256_cmp_ps(o[2], o[3], _CMP_UNORD_Q)));
    if (!_mm256_testz_ps(nan, nan)) [[unlikely]] {
      for (int c = h; c < h + 64; ++c) {
        float acc = 0.f;
        for (int j = 0; j < n; ++j) acc = std::fma(w[j], bf16_to_float(rows[j][c]), acc);
        out[c] = float_to_bf16(acc);
      }
      continue;
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i r = _mm256_or_si256(_mm256_srli_epi32(round_hi(e[k]), 16),
                                        _mm256_and_si256(round_hi(o[k]), hi_mask));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + h) + k, r);
    }
  }
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

void weighted_sum_f32(const float* const* rows, const float* w, int n, int hidden, float* out) {
  // 64 columns of partial sums stay in registers while every row passes once.
  constexpr int kCols = 64;
  int h = 0;
  for (; h + kCols <= hidden; h += kCols) {
    float acc[kCols] = {};
    for (int j = 0; j < n; ++j) {
      const float wj = w[j], *r = rows[j] + h;
#pragma GCC unroll 8
      for (int c = 0; c < kCols; ++c) acc[c] = std::fma(wj, r[c], acc[c]);
    }
    for (int c = 0; c < kCols; ++c) out[h + c] = acc[c];
  }
  for (; h < hidden; ++h) {
    float acc = 0.f;
    for (int j = 0; j < n; ++j) acc = std::fma(w[j], rows[j][h], acc);
    out[h] = acc;
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

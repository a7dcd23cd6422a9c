// The micro-kernels of the int8 linear layers (internal to int8_linear.cc): the int32 sums
// of T tokens against a pair of int8 panels (int8_linear.h: 32 rows, k in groups of 4
// columns, 128 bytes a group), one per instruction set, and the fp32 epilogue they share.
//
// Every tile writes exact int32 sums Σ_c xq[t][c] · W[r][c] into acc [T][32] (row stride
// ldacc), so the paths differ only in how they get there:
//
//   vnni   x as u8 = xq + 128, [m][ld] bytes; per group two 64-byte weight loads, per token
//          one 4-byte broadcast and two vpdpbusd. The accumulators start at the rows'
//          correction (-128 · Σ w) on a first k block, at acc otherwise.
//   avx2   x as int16, [m][ld]; per group and quad of 4 rows (16 bytes) one vpmovsxbw into
//          16 int16 (row 4q + i's 4 columns at words 4i..4i+3), per token one vpmaddwd
//          against x's 4 columns broadcast as 64 bits: lane 2i holds row i's columns 0-1,
//          lane 2i + 1 its columns 2-3; vpaddd into int32. At the end vphaddd + vpermq put
//          each row's two lanes together. Products of int16 in [-128, 127] never saturate.
//   scalar the plain loop.
//
// The epilogue is AVX2 for every path (8 lanes; AVX-512 would give the same bits): the
// f32 outputs are the same IEEE operations on the same int32 sums whatever path made them.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/vec_math.h"

namespace xds::kernels::int8_detail {

#define XDS_INT8_INLINE __attribute__((always_inline)) inline

inline constexpr int64_t kPairRows = 32;
inline constexpr int64_t kGroupCols = 4;     // k columns per group
inline constexpr int64_t kGroupBytes = 128;  // a group of a pair: 32 rows × 4 bytes
inline constexpr int64_t kLineBytes = 64;

// Software prefetch along a pair's stream: a group's two lines at `at` every `every`
// groups, `groups` times (then at moves on by a group).
struct Prefetch {
  const int8_t* at = nullptr;
  int64_t every = 1;
  int64_t groups = 0;
};

// Called once per group of a tile's loop.
XDS_INT8_INLINE void prefetch_step(Prefetch& pf, int64_t& countdown) {
  if (pf.groups > 0 && --countdown == 0) {
    _mm_prefetch(reinterpret_cast<const char*>(pf.at), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(pf.at + kLineBytes), _MM_HINT_T0);
    pf.at += kGroupBytes;
    --pf.groups;
    countdown = pf.every;
  }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
inline constexpr bool kHaveVnni = true;
inline constexpr int kVnniMaxTokens = 12;  // 24 accumulators, two weights and a broadcast

// Groups [gb, ge) of the pair at w for T tokens of x (u8, row stride ldx): acc [T][32]
// (stride ldacc) = start (the correction, [32]) or acc, plus Σ (xq + 128) · w.
template <int T>
void vnni_tile(const uint8_t* x, int64_t ldx, const int8_t* w, int64_t gb, int64_t ge,
               const int32_t* start, int32_t* acc, int64_t ldacc, Prefetch pf) {
  __m512i a0[T], a1[T];
  if (start != nullptr) {
    const __m512i s0 = _mm512_loadu_si512(start), s1 = _mm512_loadu_si512(start + 16);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) a0[t] = s0, a1[t] = s1;
  } else {
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      a0[t] = _mm512_loadu_si512(acc + t * ldacc);
      a1[t] = _mm512_loadu_si512(acc + t * ldacc + 16);
    }
  }
  int64_t countdown = pf.every;
  for (int64_t g = gb; g < ge; ++g) {
    prefetch_step(pf, countdown);
    const int8_t* wg = w + g * kGroupBytes;
    const __m512i w0 = _mm512_load_si512(wg), w1 = _mm512_load_si512(wg + kLineBytes);
    const uint8_t* xg = x + g * kGroupCols;
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      int32_t v;
      std::memcpy(&v, xg + t * ldx, sizeof v);
      const __m512i xb = _mm512_set1_epi32(v);
      a0[t] = _mm512_dpbusd_epi32(a0[t], xb, w0);
      a1[t] = _mm512_dpbusd_epi32(a1[t], xb, w1);
    }
  }
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_si512(acc + t * ldacc, a0[t]);
    _mm512_storeu_si512(acc + t * ldacc + 16, a1[t]);
  }
}
#else
inline constexpr bool kHaveVnni = false;
inline constexpr int kVnniMaxTokens = 1;
#endif

inline constexpr int kAvx2MaxTokens = 2;  // per pass over one panel: 8 accumulators

// Groups [gb, ge) for T tokens of x (int16, row stride ldx) and Q quads of rows from quad
// q0 of the pair at w: acc[t][4 q0 .. 4 (q0 + Q)) = (first ? 0 : acc) + Σ xq · w. Q even.
template <int T, int Q>
void avx2_tile(const int16_t* x, int64_t ldx, const int8_t* w, int q0, int64_t gb, int64_t ge,
               bool first, int32_t* acc, int64_t ldacc, Prefetch pf) {
  static_assert(Q % 2 == 0);
  __m256i a[T * Q];
#pragma GCC unroll 16
  for (int i = 0; i < T * Q; ++i) a[i] = _mm256_setzero_si256();
  int64_t countdown = pf.every;
  for (int64_t g = gb; g < ge; ++g) {
    prefetch_step(pf, countdown);
    __m256i xb[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      long long v;
      std::memcpy(&v, x + t * ldx + g * kGroupCols, sizeof v);
      xb[t] = _mm256_set1_epi64x(v);
    }
    const int8_t* wg = w + g * kGroupBytes + q0 * 16;
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) {
      const __m256i wv =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + q * 16)));
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        a[t * Q + q] = _mm256_add_epi32(a[t * Q + q], _mm256_madd_epi16(wv, xb[t]));
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 4
    for (int q = 0; q < Q; q += 2) {
      // [r0 r1 r4 r5 | r2 r3 r6 r7] of quads q, q + 1, then the 64-bit pairs in row order.
      const __m256i h = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a[t * Q + q], a[t * Q + q + 1]),
                                                 _MM_SHUFFLE(3, 1, 2, 0));
      auto* dst = reinterpret_cast<__m256i*>(acc + t * ldacc + 4 * (q0 + q));
      _mm256_storeu_si256(dst, first ? h : _mm256_add_epi32(_mm256_loadu_si256(dst), h));
    }
  }
}

// All groups for n tokens of x (int8, row stride ldx) against the pair at w: acc [n][32].
inline void scalar_pair(const int8_t* x, int64_t n, int64_t ldx, const int8_t* w, int64_t groups,
                        int32_t* acc, int64_t ldacc) {
  for (int64_t t = 0; t < n; ++t) {
    for (int r = 0; r < kPairRows; ++r) {
      const int8_t* wr = w + (r / 16) * kLineBytes + (r % 16) * 4;
      int32_t s = 0;  // |partial sums| <= 128 · 128 · k < 2^31 (kInt8MaxCols)
      for (int64_t g = 0; g < groups; ++g)
        for (int i = 0; i < 4; ++i)
          s += int32_t{x[t * ldx + g * 4 + i]} * int32_t{wr[g * kGroupBytes + i]};
      acc[t * ldacc + r] = s;
    }
  }
}

// The epilogue (AVX2 on every path). bf16: round to nearest even as base/bf16.h (the values
// are finite: no NaN case).
XDS_INT8_INLINE __m128i to_bf16(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

// Where a token's outputs for one pair go: `real` of its 32 rows (the rest are padding).
struct PairOut {
  float* f32;      // or null
  uint16_t* bf16;  // or null
  int real;
};

XDS_INT8_INLINE void store_pair_row(const float* v, const PairOut& o) {
  if (o.f32 != nullptr) {
    std::memcpy(o.f32, v, sizeof(float) * static_cast<size_t>(o.real));
    return;
  }
  alignas(32) uint16_t b[kPairRows];
  for (int i = 0; i < kPairRows; i += 8)
    _mm_store_si128(reinterpret_cast<__m128i*>(b + i), to_bf16(_mm256_load_ps(v + i)));
  std::memcpy(o.bf16, b, sizeof(uint16_t) * static_cast<size_t>(o.real));
}

// y = (float(acc) · sw) · sx for the 32 rows of a pair (acc [32], sw [32]).
inline void epilogue_linear(const int32_t* acc, const float* sw, float sx, const PairOut& o) {
  alignas(32) float v[kPairRows];
  const __m256 vx = _mm256_set1_ps(sx);
  for (int i = 0; i < kPairRows; i += 8) {
    const __m256 a =
        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i)));
    _mm256_store_ps(v + i, _mm256_mul_ps(_mm256_mul_ps(a, _mm256_loadu_ps(sw + i)), vx));
  }
  store_pair_row(v, o);
}

// h = g / (1 + exp(-g)) · u with g, u as epilogue_linear computes them (ops.h silu_mul's
// vector steps).
inline void epilogue_gate_up(const int32_t* acc_g, const int32_t* acc_u, const float* sw_g,
                             const float* sw_u, float sx, const PairOut& o) {
  alignas(32) float v[kPairRows];
  const __m256 vx = _mm256_set1_ps(sx), one = _mm256_set1_ps(1.0f);
  for (int i = 0; i < kPairRows; i += 8) {
    const __m256 ag =
        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc_g + i)));
    const __m256 au =
        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc_u + i)));
    const __m256 g = _mm256_mul_ps(_mm256_mul_ps(ag, _mm256_loadu_ps(sw_g + i)), vx);
    const __m256 u = _mm256_mul_ps(_mm256_mul_ps(au, _mm256_loadu_ps(sw_u + i)), vx);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_store_ps(v + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u));
  }
  store_pair_row(v, o);
}

#undef XDS_INT8_INLINE

}  // namespace xds::kernels::int8_detail

// The AVX-512 pair kernels of the int4 linear layers (int4_linear.h, int4_kernels.h):
// W4A8 on vpdpbusd, W4A16 on vpermps + vfmadd, both over a pair's 64-byte lines
// (32 rows × 4 columns: rows 0-15 in the low nibbles, 16-31 in the high ones).
#include <immintrin.h>

#include <cstring>

#include "base/check.h"
#include "kernels/cpu/int4_kernels.h"
#include "kernels/cpu/static_dispatch.h"

namespace xds::kernels::int4_detail {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
namespace {

constexpr int kA8MaxTokens = 6;   // 12 int32 accumulators (f lives in acc, in L1)
constexpr int kA16MaxTokens = 4;  // 24 accumulators (two partial sums and f per 16 rows)

// The maskz forms of the conversions: the plain ones trip GCC 12's maybe-uninitialized
// warning (as mla_attention_bf16.cc).
constexpr __mmask16 kAll = 0xffff;

__m512 to_f32(__m512i v) {
  return _mm512_maskz_cvtepi32_ps(kAll, v);
}

// 16 zero points (uint8) as int32 lanes.
__m512i zero_points(const uint8_t* z) {
  return _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(z)));
}

__m512i broadcast_4_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// Groups [gb, ge) of the pair for T tokens from t0: acc[t][0..32) = (gb == 0 ? 0 : acc) +
// Σ_g fma(float(s), sw, ·), s started at -z · Σ xq and summed by vpdpbusd.
template <int T, bool kAsym>
void a8_tile(const A8Tokens& x, int64_t t0, const PairView& w, int64_t gb, int64_t ge, float* acc) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int64_t lines = w.group_cols / kQuadCols;
  const int8_t* xt = x.q + t0 * x.ld;
  for (int64_t g = gb; g < ge; ++g) {
    __m512i s0[T], s1[T];  // rows 0-15, 16-31
    if constexpr (kAsym) {
      // (z, 0) int16 pairs by (-Σ xq, 0): z · -Σ xq exactly (|Σ xq| <= 128 · 128).
      const __m512i z0 = zero_points(w.zero + g * kPairRows);
      const __m512i z1 = zero_points(w.zero + g * kPairRows + 16);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512i nx = _mm512_set1_epi32(-x.xsum[(t0 + t) * w.groups + g] & 0xffff);
        s0[t] = _mm512_madd_epi16(z0, nx);
        s1[t] = _mm512_madd_epi16(z1, nx);
      }
    } else {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        s0[t] = s1[t] = _mm512_set1_epi32(-8 * x.xsum[(t0 + t) * w.groups + g]);
    }
    const uint8_t* line = w.data + g * lines * kLineBytes;
    const int8_t* xg = xt + g * w.group_cols;
    for (int64_t l = 0; l < lines; ++l, line += kLineBytes) {
      _mm_prefetch(reinterpret_cast<const char*>(line + kAheadBytes), _MM_HINT_T0);
      const __m512i v = _mm512_load_si512(line);
      const __m512i lo = _mm512_and_si512(v, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512i xb = broadcast_4_bytes(xg + t * x.ld + l * kQuadCols);
        s0[t] = _mm512_dpbusd_epi32(s0[t], lo, xb);
        s1[t] = _mm512_dpbusd_epi32(s1[t], hi, xb);
      }
    }
    // f = fma(float(s), sw, f) in acc (L1), from 0 on the first group.
    const __m512 sw0 = _mm512_loadu_ps(w.scale + g * kPairRows);
    const __m512 sw1 = _mm512_loadu_ps(w.scale + g * kPairRows + 16);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float* f = acc + (t0 + t) * kPairRows;
      const __m512 f0 = g == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(f);
      const __m512 f1 = g == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(f + 16);
      _mm512_storeu_ps(f, _mm512_fmadd_ps(to_f32(s0[t]), sw0, f0));
      _mm512_storeu_ps(f + 16, _mm512_fmadd_ps(to_f32(s1[t]), sw1, f1));
    }
  }
}

// One column of a line for T tokens: w_lo / w_hi = q - 8 of rows 0-15 / 16-31 at column i
// (the line shifted so that the nibble is the lane's low 4 bits: vpermps ignores the rest).
template <int T>
__attribute__((always_inline)) inline void a16_column(__m512i v, int shift, __m512 table,
                                                      const float* xc, int64_t ldx, __m512* p0,
                                                      __m512* p1) {
  const __m512 w_lo =
      _mm512_maskz_permutexvar_ps(kAll, _mm512_maskz_srli_epi32(kAll, v, shift), table);
  const __m512 w_hi =
      _mm512_maskz_permutexvar_ps(kAll, _mm512_maskz_srli_epi32(kAll, v, shift + 4), table);
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const __m512 xb = _mm512_set1_ps(xc[t * ldx]);
    p0[t] = _mm512_fmadd_ps(xb, w_lo, p0[t]);
    p1[t] = _mm512_fmadd_ps(xb, w_hi, p1[t]);
  }
}

// W4A16, groups [gb, ge) for T tokens from t0 (as a8_tile). Per group and 16 rows two
// partial sums, pa of columns 4u + 0, 1 and pb of 4u + 2, 3, added at the group's end.
template <int T, bool kAsym>
void a16_tile(const A16Tokens& x, int64_t t0, const PairView& w, int64_t gb, int64_t ge,
              float* acc) {
  __m512 f0[T], f1[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    f0[t] = gb == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (t0 + t) * kPairRows);
    f1[t] = gb == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (t0 + t) * kPairRows + 16);
  }
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t lines = w.group_cols / kQuadCols;
  const float* xt = x.x + t0 * x.ld;
  for (int64_t g = gb; g < ge; ++g) {
    __m512 pa0[T], pa1[T], pb0[T], pb1[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) pa0[t] = pa1[t] = pb0[t] = pb1[t] = _mm512_setzero_ps();
    const uint8_t* line = w.data + g * lines * kLineBytes;
    const float* xg = xt + g * w.group_cols;
    for (int64_t l = 0; l < lines; ++l, line += kLineBytes) {
      _mm_prefetch(reinterpret_cast<const char*>(line + kAheadBytes), _MM_HINT_T0);
      const __m512i v = _mm512_load_si512(line);
      const float* xc = xg + l * kQuadCols;
      a16_column<T>(v, 0, table, xc + 0, x.ld, pa0, pa1);
      a16_column<T>(v, 8, table, xc + 1, x.ld, pa0, pa1);
      a16_column<T>(v, 16, table, xc + 2, x.ld, pb0, pb1);
      a16_column<T>(v, 24, table, xc + 3, x.ld, pb0, pb1);
    }
    const __m512 sw0 = _mm512_loadu_ps(w.scale + g * kPairRows);
    const __m512 sw1 = _mm512_loadu_ps(w.scale + g * kPairRows + 16);
    __m512 zc0 = _mm512_setzero_ps(), zc1 = _mm512_setzero_ps();
    if constexpr (kAsym) {  // 8 - z, exact
      const __m512 eight = _mm512_set1_ps(8.0f);
      zc0 = _mm512_sub_ps(eight, to_f32(zero_points(w.zero + g * kPairRows)));
      zc1 = _mm512_sub_ps(eight, to_f32(zero_points(w.zero + g * kPairRows + 16)));
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      __m512 p0 = _mm512_add_ps(pa0[t], pb0[t]), p1 = _mm512_add_ps(pa1[t], pb1[t]);
      if constexpr (kAsym) {
        const __m512 xs = _mm512_set1_ps(x.xsum[(t0 + t) * w.groups + g]);
        p0 = _mm512_fmadd_ps(zc0, xs, p0);
        p1 = _mm512_fmadd_ps(zc1, xs, p1);
      }
      f0[t] = _mm512_fmadd_ps(p0, sw0, f0[t]);
      f1[t] = _mm512_fmadd_ps(p1, sw1, f1[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(acc + (t0 + t) * kPairRows, f0[t]);
    _mm512_storeu_ps(acc + (t0 + t) * kPairRows + 16, f1[t]);
  }
}

// The passes of a pair with the tile of `tokens` tokens (1..Max) and the weights' symmetry.
template <int Max, template <int, bool> class Tile, class X>
void run_pair(const X& x, const PairView& w, float* acc) {
  for_each_pass(x.m, Max, w, [&](int64_t t0, int tokens, int64_t gb, int64_t ge) {
    const bool ran = dispatch_1_to<Max>(tokens, [&]<int T>() {
      if (w.zero != nullptr) {
        Tile<T, true>::run(x, t0, w, gb, ge, acc);
      } else {
        Tile<T, false>::run(x, t0, w, gb, ge, acc);
      }
    });
    XDS_CHECK(ran, "int4 avx512 tile: {} tokens", tokens);
  });
}

template <int T, bool kAsym>
struct A8Tile {
  static void run(const A8Tokens& x, int64_t t0, const PairView& w, int64_t gb, int64_t ge,
                  float* acc) {
    a8_tile<T, kAsym>(x, t0, w, gb, ge, acc);
  }
};

template <int T, bool kAsym>
struct A16Tile {
  static void run(const A16Tokens& x, int64_t t0, const PairView& w, int64_t gb, int64_t ge,
                  float* acc) {
    a16_tile<T, kAsym>(x, t0, w, gb, ge, acc);
  }
};

}  // namespace

void a8_pair_avx512(const A8Tokens& x, const PairView& w, float* acc) {
  run_pair<kA8MaxTokens, A8Tile>(x, w, acc);
}

void a16_pair_avx512(const A16Tokens& x, const PairView& w, float* acc) {
  run_pair<kA16MaxTokens, A16Tile>(x, w, acc);
}

#else
void a8_pair_avx512(const A8Tokens&, const PairView&, float*) {
  XDS_CHECK(false, "int4: this build has no AVX512_VNNI");
}
void a16_pair_avx512(const A16Tokens&, const PairView&, float*) {
  XDS_CHECK(false, "int4: this build has no AVX512_VNNI");
}
#endif

}  // namespace xds::kernels::int4_detail

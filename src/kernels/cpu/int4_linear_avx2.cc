// The AVX2 pair kernels of the int4 linear layers (int4_linear.h, int4_kernels.h), half a
// pair at a time: half h of every 64-byte line is 32 bytes, rows 8h..8h+7 in the low
// nibbles and rows 16+8h..16+8h+7 in the high ones, each row's 4 columns in a 32-bit lane.
//
//   W4A8   vpmaddubsw (q u8 × xq s8) gives each row's column pairs as int16 (|·| <= 3840);
//          the int16 sums of up to 8 lines are added (|·| <= 30720 < 2^15), then vpmaddwd
//          by ones folds them into the int32 lane. The int32 sums start at -z · Σ xq.
//   W4A16  per column: shift, and 0xf, subtract 8, vcvtdq2ps, FMA by x broadcast, in two
//          partial sums per 8 rows (columns 4u + 0, 1 and 4u + 2, 3) as the AVX-512 path.
// The fp32 sums f live in acc (L1) between groups: loaded, one fma, stored.
#include <immintrin.h>

#include <cstring>

#include "base/check.h"
#include "kernels/cpu/int4_kernels.h"
#include "kernels/cpu/static_dispatch.h"

namespace xds::kernels::int4_detail {
namespace {

constexpr int kMaxTokens = 2;
// Lines whose vpmaddubsw int16 sums may be added before widening: 8 · 2 · 15 · 128 < 2^15.
constexpr int64_t kInt16Lines = 8;

// acc's 8 lanes of rows [row, row + 8) for token t: f = fma(v, sw, gb == 0 ? 0 : f).
__attribute__((always_inline)) inline void fma_into(float* f, __m256 v, const float* sw,
                                                    bool first) {
  const __m256 old = first ? _mm256_setzero_ps() : _mm256_loadu_ps(f);
  _mm256_storeu_ps(f, _mm256_fmadd_ps(v, _mm256_loadu_ps(sw), old));
}

__m256i zero_points(const uint8_t* z) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(z)));
}

// W4A8, half h of the pair, groups [gb, ge), T tokens from t0.
template <int T, bool kAsym>
void a8_half(const A8Tokens& x, int64_t t0, const PairView& w, int h, int64_t gb, int64_t ge,
             float* acc) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const int64_t lines = w.group_cols / kQuadCols;
  const int r_lo = 8 * h, r_hi = 16 + 8 * h;  // the first row of each octet
  for (int64_t g = gb; g < ge; ++g) {
    __m256i s_lo[T], s_hi[T];
    if constexpr (kAsym) {
      const __m256i z_lo = zero_points(w.zero + g * kPairRows + r_lo);
      const __m256i z_hi = zero_points(w.zero + g * kPairRows + r_hi);
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t) {
        const __m256i nx = _mm256_set1_epi32(-x.xsum[(t0 + t) * w.groups + g] & 0xffff);
        s_lo[t] = _mm256_madd_epi16(z_lo, nx);
        s_hi[t] = _mm256_madd_epi16(z_hi, nx);
      }
    } else {
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t)
        s_lo[t] = s_hi[t] = _mm256_set1_epi32(-8 * x.xsum[(t0 + t) * w.groups + g]);
    }
    const uint8_t* group = w.data + g * lines * kLineBytes + 32 * h;
    const int8_t* xg = x.q + t0 * x.ld + g * w.group_cols;
    for (int64_t l0 = 0; l0 < lines; l0 += kInt16Lines) {
      __m256i p_lo[T], p_hi[T];
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t) p_lo[t] = p_hi[t] = _mm256_setzero_si256();
      for (int64_t l = l0; l < l0 + kInt16Lines; ++l) {  // lines is a multiple of 8
        const uint8_t* line = group + l * kLineBytes;
        if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(line + kAheadBytes), _MM_HINT_T0);
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(line));
        const __m256i lo = _mm256_and_si256(v, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
#pragma GCC unroll 2
        for (int t = 0; t < T; ++t) {
          int32_t xv;
          std::memcpy(&xv, xg + t * x.ld + l * kQuadCols, sizeof xv);
          const __m256i xb = _mm256_set1_epi32(xv);
          p_lo[t] = _mm256_add_epi16(p_lo[t], _mm256_maddubs_epi16(lo, xb));
          p_hi[t] = _mm256_add_epi16(p_hi[t], _mm256_maddubs_epi16(hi, xb));
        }
      }
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t) {
        s_lo[t] = _mm256_add_epi32(s_lo[t], _mm256_madd_epi16(p_lo[t], ones));
        s_hi[t] = _mm256_add_epi32(s_hi[t], _mm256_madd_epi16(p_hi[t], ones));
      }
    }
    const float* sw = w.scale + g * kPairRows;
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
      float* f = acc + (t0 + t) * kPairRows;
      fma_into(f + r_lo, _mm256_cvtepi32_ps(s_lo[t]), sw + r_lo, g == 0);
      fma_into(f + r_hi, _mm256_cvtepi32_ps(s_hi[t]), sw + r_hi, g == 0);
    }
  }
}

// q - 8 of the column whose nibble is at bit `shift` of each lane, as fp32.
__attribute__((always_inline)) inline __m256 a16_weights(__m256i v, int shift) {
  const __m256i q = _mm256_and_si256(_mm256_srli_epi32(v, shift), _mm256_set1_epi32(0x0f));
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8)));
}

// W4A16, half h of the pair, groups [gb, ge), T tokens from t0.
template <int T, bool kAsym>
void a16_half(const A16Tokens& x, int64_t t0, const PairView& w, int h, int64_t gb, int64_t ge,
              float* acc) {
  const int64_t lines = w.group_cols / kQuadCols;
  const int r_lo = 8 * h, r_hi = 16 + 8 * h;
  for (int64_t g = gb; g < ge; ++g) {
    __m256 pa_lo[T], pa_hi[T], pb_lo[T], pb_hi[T];
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) pa_lo[t] = pa_hi[t] = pb_lo[t] = pb_hi[t] = _mm256_setzero_ps();
    const uint8_t* group = w.data + g * lines * kLineBytes + 32 * h;
    const float* xg = x.x + t0 * x.ld + g * w.group_cols;
    for (int64_t l = 0; l < lines; ++l) {
      const uint8_t* line = group + l * kLineBytes;
      if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(line + kAheadBytes), _MM_HINT_T0);
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(line));
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256 w_lo = a16_weights(v, 8 * i), w_hi = a16_weights(v, 8 * i + 4);
#pragma GCC unroll 2
        for (int t = 0; t < T; ++t) {
          const __m256 xb = _mm256_set1_ps(xg[t * x.ld + l * kQuadCols + i]);
          __m256& p_lo = i < 2 ? pa_lo[t] : pb_lo[t];
          __m256& p_hi = i < 2 ? pa_hi[t] : pb_hi[t];
          p_lo = _mm256_fmadd_ps(xb, w_lo, p_lo);
          p_hi = _mm256_fmadd_ps(xb, w_hi, p_hi);
        }
      }
    }
    const float* sw = w.scale + g * kPairRows;
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
      __m256 p_lo = _mm256_add_ps(pa_lo[t], pb_lo[t]), p_hi = _mm256_add_ps(pa_hi[t], pb_hi[t]);
      if constexpr (kAsym) {  // + (8 - z) · Σ x, 8 - z exact
        const __m256 eight = _mm256_set1_ps(8.0f);
        const __m256 xs = _mm256_set1_ps(x.xsum[(t0 + t) * w.groups + g]);
        const __m256 zc_lo =
            _mm256_sub_ps(eight, _mm256_cvtepi32_ps(zero_points(w.zero + g * kPairRows + r_lo)));
        const __m256 zc_hi =
            _mm256_sub_ps(eight, _mm256_cvtepi32_ps(zero_points(w.zero + g * kPairRows + r_hi)));
        p_lo = _mm256_fmadd_ps(zc_lo, xs, p_lo);
        p_hi = _mm256_fmadd_ps(zc_hi, xs, p_hi);
      }
      float* f = acc + (t0 + t) * kPairRows;
      fma_into(f + r_lo, p_lo, sw + r_lo, g == 0);
      fma_into(f + r_hi, p_hi, sw + r_hi, g == 0);
    }
  }
}

template <int T, bool kAsym>
struct A8Half {
  static void run(const A8Tokens& x, int64_t t0, const PairView& w, int h, int64_t gb, int64_t ge,
                  float* acc) {
    a8_half<T, kAsym>(x, t0, w, h, gb, ge, acc);
  }
};

template <int T, bool kAsym>
struct A16Half {
  static void run(const A16Tokens& x, int64_t t0, const PairView& w, int h, int64_t gb, int64_t ge,
                  float* acc) {
    a16_half<T, kAsym>(x, t0, w, h, gb, ge, acc);
  }
};

// The passes of a pair: per k block and pass, both halves (the block's second half from L1).
template <template <int, bool> class Half, class X>
void run_pair(const X& x, const PairView& w, float* acc) {
  for_each_pass(x.m, kMaxTokens, w, [&](int64_t t0, int tokens, int64_t gb, int64_t ge) {
    const bool ran = dispatch_1_to<kMaxTokens>(tokens, [&]<int T>() {
      for (int h = 0; h < 2; ++h) {
        if (w.zero != nullptr) {
          Half<T, true>::run(x, t0, w, h, gb, ge, acc);
        } else {
          Half<T, false>::run(x, t0, w, h, gb, ge, acc);
        }
      }
    });
    XDS_CHECK(ran, "int4 avx2 tile: {} tokens", tokens);
  });
}

}  // namespace

void a8_pair_avx2(const A8Tokens& x, const PairView& w, float* acc) {
  run_pair<A8Half>(x, w, acc);
}

void a16_pair_avx2(const A16Tokens& x, const PairView& w, float* acc) {
  run_pair<A16Half>(x, w, acc);
}

}  // namespace xds::kernels::int4_detail

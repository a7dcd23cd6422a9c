// The micro-kernels of the panel linears (internal to panel_driver.h and linear_panels*.cc):
// T tokens × P adjacent panels
// over columns [kb, ke), one tile per instruction set and weight format (Bf16Format,
// F16Format, Fp8Format below).
//
//   x: [T][ldx] fp32; w: panel p's column 0 (kPanels16, tensor/matrix.h: each column 16
//   elements with rows j and 8 + j paired), column c at w + 32c (kPairStride), panel p + 1
//   (for P = 2 the other half of p's pair) at w + 16; y: [T][ldy], rows 16P.
//
// acc[t][r] (+)= Σ_{c in [kb, ke)} x[t][c] · w[c][r], the accumulators being y[t][0 .. 16P)
// (loaded unless `first`, which starts from 0), one fused multiply-add per column in
// ascending c: both instruction sets give the same bits. Every G columns the tile prefetches
// the line at `pf` and steps it on by a line (a BF16 line is one column of both panels).
//
// AVX2 (16 ymm registers): a BF16 column is one 32-byte load widened by a shift (rows 0-7)
// and a mask (rows 8-15); T tokens × P panels × 2 halves accumulators + the widened halves +
// one broadcast: T ≤ 6 for P = 1 (12 + 3), T ≤ 3 for P = 2 (12 + 4 + 1 > 16: GCC keeps two
// accumulators on the stack, which costs less than the second stream gains). FP8 adds the
// segment's scales and the widening's constants, so it keeps more on the stack.
//
// AVX-512 (32 zmm registers): a column is zero-extended to 16 lanes and shifted, one
// register in the pair order (lane 2j = row j, lane 2j + 1 = row 8 + j), permuted back to
// row order only when y is loaded or stored; T × P accumulators: T ≤ 8 for P = 1, T ≤ 12 for
// P = 2 (the token loop fully unrolled, or the accumulators go to memory).
// Per column a token costs one FMA instead of two.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "base/check.h"
#include "kernels/cpu/static_dispatch.h"
#include "tensor/matrix.h"

namespace xds::kernels::panel_detail {

inline constexpr int64_t kLineBytes = 64;
inline constexpr int kWideTileTokens = 12;  // tokens per tile of the wide path (below)

// How a panel column of 16 elements becomes 16 fp32 values (widen_column, per ISA below).
// BF16: exact, `lane << 16` / `lane & 0xffff0000`.
// 16-bit elements without scales (Bf16Format, F16Format): one segment, scale 1.
template <class Self>
struct Unscaled16 {
  using Elem = uint16_t;
  static constexpr int64_t kColumnBytes = kPanelRows * 2;
  static Self of(const MatrixRef&, int64_t) { return {}; }
  int64_t segment_end(int64_t, int64_t ke) const { return ke; }
  float scale(int64_t, int) const { return 1.0f; }
};

struct Bf16Format : Unscaled16<Bf16Format> {};

// F16 (IEEE binary16, as F16 checkpoints store their weights): exact, vcvtph2ps (normals,
// subnormals, infinities and NaN alike). The panels hold the checkpoint's 16-bit elements
// in BF16's layout, so an F16 model streams two bytes per weight, not the four of the F32
// rows it was widened to before.
struct F16Format : Unscaled16<F16Format> {};

// F8_E4M3 with block scales (tensor/matrix.h): an element's sign and its 7 exponent and
// mantissa bits placed in an fp16's sign and bits 7-13 are its value times 2^-8 (exponent
// biases 7 and 15; a subnormal lands on an fp16 subnormal), converted exactly to fp32
// (vcvtph2ps, a normal fp32 whatever the element), and the stored scale carries the 2^8
// back: one rounding, the dequantized weight's. (Placing the bits straight into an fp32
// would make subnormal elements fp32 subnormals, and a multiply with one takes a microcode
// assist: a few such bytes slow a column several times, docs/benchmarks.md.) 0x7f/0xff (NaN)
// are refused when the panels are written.
struct Fp8Format {
  using Elem = uint8_t;
  static constexpr int64_t kColumnBytes = kPanelRows;
  const float* scales;  // panel p's [blocks], then panel p + 1's
  int64_t blocks;
  int shift;
  static Fp8Format of(const MatrixRef& w, int64_t p) {
    return {w.scales + p * w.scale_blocks(), w.scale_blocks(), w.scale_shift};
  }
  float scale(int64_t c, int panel) const { return scales[panel * blocks + (c >> shift)]; }
  // The end of column c's scale block (at most ke): the tiles walk block by block, with
  // the block's scales in registers.
  int64_t segment_end(int64_t c, int64_t ke) const {
    return std::min(ke, ((c >> shift) + 1) << shift);
  }
};
inline constexpr uint16_t kFp8AsF16Bits = 0xBF80;  // sign, then bits 7-13 (<< 7)

// column(c) for c in [kb, ke), with a prefetch of the line at pf every G columns, pf
// stepping on a line each time. Returns pf stepped on.
template <int G, class Column>
__attribute__((always_inline)) inline const char* walk_columns(int64_t kb, int64_t ke,
                                                               const char* pf, Column& column) {
  static_assert(G > 0);
  int64_t c = kb;
  for (; c + G <= ke; c += G) {
    _mm_prefetch(pf, _MM_HINT_T0);
    pf += kLineBytes;
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) column(c + g);
  }
  for (; c < ke; ++c) column(c);
  return pf;
}

// walk_columns over the format's segments (FP8: scale blocks; BF16: all of [kb, ke)), with
// begin(first column) before each: the tile loads the segment's scales there.
template <int G, class Fmt, class Column, class Begin>
__attribute__((always_inline)) inline void walk_segments(const Fmt& f, int64_t kb, int64_t ke,
                                                         const char* pf, Column& column,
                                                         Begin&& begin) {
  for (int64_t s = kb; s < ke;) {
    const int64_t e = f.segment_end(s, ke);
    begin(s);
    pf = walk_columns<G>(s, e, pf, column);
    s = e;
  }
}

struct Avx2 {
  static constexpr int kMaxTokens = 6;           // P = 1
  static constexpr int kMaxTokensTwoPanels = 3;  // P = 2
  static constexpr bool kTwoPanelPasses = false;
};

// Rows j (lo) and 8 + j (hi) of one panel column as two 8-lane halves.
__attribute__((always_inline)) inline void widen_column_avx2(const Bf16Format&, const uint16_t* col,
                                                             __m256, __m256& lo, __m256& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col));
  lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// The column's 16-bit elements in row order within each 128-bit half (the even ones, rows
// 0-3 / 4-7, then the odd ones, rows 8-11 / 12-15), the halves' quarters regrouped (rows
// 0-7, then 8-15), each half converted.
__attribute__((always_inline)) inline void widen_column_avx2(const F16Format&, const uint16_t* col,
                                                             __m256, __m256& lo, __m256& hi) {
  const __m256i v =
      _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)),
                          _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,  //
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  const __m256i rows = _mm256_permute4x64_epi64(v, 0xD8);  // quarters 0, 2, 1, 3
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(rows));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(rows, 1));
}

// The column's bytes in row order (the even ones, rows 0-7, then the odd ones), sign-extended
// to 16 bits, moved up 7 (the sign fills bits 7-15) and masked to the sign and bits 7-13:
// rows 0-7 and 8-15 as fp16, each half converted and scaled.
__attribute__((always_inline)) inline void widen_column_avx2(const Fp8Format&, const uint8_t* col,
                                                             __m256 s, __m256& lo, __m256& hi) {
  const __m128i rows =
      _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col)),
                       _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(rows), 7),
                                     _mm256_set1_epi16(static_cast<int16_t>(kFp8AsF16Bits)));
  lo = _mm256_mul_ps(s, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
  hi = _mm256_mul_ps(s, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}

template <int T, int P, int G, class Fmt>
void panel_tile_avx2(const Fmt& f, const float* x, int64_t ldx, const typename Fmt::Elem* w,
                     int64_t kb, int64_t ke, bool first, float* y, int64_t ldy, const char* pf) {
  static_assert(P == 1 || P == 2);
  __m256 a0[T], a1[T], a2[T], a3[T];
  const typename Fmt::Elem* w2 = w + kPanelRows;  // the pair's other panel
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const float* yt = y + t * ldy;
    a0[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt);
    a1[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt + 8);
    if constexpr (P == 2) {
      a2[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt + 16);
      a3[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt + 24);
    }
  }
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;  // the segment's scales (FP8)
  auto column = [&](int64_t c) __attribute__((always_inline)) {
    __m256 lo, hi, lo2, hi2;
    widen_column_avx2(f, w + c * kPairStride, s0, lo, hi);
    if constexpr (P == 2) widen_column_avx2(f, w2 + c * kPairStride, s1, lo2, hi2);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + t * ldx + c);
      a0[t] = _mm256_fmadd_ps(xb, lo, a0[t]);
      a1[t] = _mm256_fmadd_ps(xb, hi, a1[t]);
      if constexpr (P == 2) {
        a2[t] = _mm256_fmadd_ps(xb, lo2, a2[t]);
        a3[t] = _mm256_fmadd_ps(xb, hi2, a3[t]);
      }
    }
  };
  walk_segments<G>(f, kb, ke, pf, column, [&](int64_t c) {
    s0 = _mm256_set1_ps(f.scale(c, 0));
    if constexpr (P == 2) s1 = _mm256_set1_ps(f.scale(c, 1));
  });
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    float* yt = y + t * ldy;
    _mm256_storeu_ps(yt, a0[t]);
    _mm256_storeu_ps(yt + 8, a1[t]);
    if constexpr (P == 2) {
      _mm256_storeu_ps(yt + 16, a2[t]);
      _mm256_storeu_ps(yt + 24, a3[t]);
    }
  }
}

#if defined(__AVX512F__)
inline constexpr bool kHaveAvx512 = true;

// One panel: up to 8 tokens (AVX-512 always takes both panels of a pair; one panel is only
// the AVX2 tile's). Two panels: up to 12 tokens in one pass (24 accumulators, 2 widened
// columns, a broadcast), more in passes of up to 12 over k blocks (kTwoPanelPasses,
// panel_driver.h). Two panels of 9-13 tokens stream an expert's weights faster than 8, then
// 12, tokens on one panel, and bench-2.6b's batch-64 routed experts run faster for it
// (docs/benchmarks.md, "Measurements behind choices in the code").
struct Avx512 {
  static constexpr int kMaxTokens = 8;
  static constexpr int kMaxTokensTwoPanels = 12;
  static constexpr bool kTwoPanelPasses = true;
};

constexpr __mmask16 kAllLanes = 0xffff;

// One panel column (16 bf16 in pair order) as 16 fp32 lanes. The zero-masking forms with a
// full mask are the plain instructions; GCC 12's plain intrinsics start from an "undefined"
// register that -Wmaybe-uninitialized flags.
__attribute__((always_inline)) inline __m512 widen_column(const Bf16Format&, const uint16_t* col,
                                                          __m512) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col));
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(kAllLanes, _mm512_maskz_cvtepu16_epi32(kAllLanes, v), 16));
}

// One panel column (16 fp16 in pair order) as 16 fp32 lanes in the same order.
__attribute__((always_inline)) inline __m512 widen_column(const F16Format&, const uint16_t* col,
                                                          __m512) {
  return _mm512_maskz_cvtph_ps(kAllLanes,
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col)));
}

// 16 FP8 elements (pair order) sign-extended to 16 bits, moved up 7 (the sign fills bits
// 7-15), masked to the sign and bits 7-13: 16 fp16 in the same order, converted to fp32 and
// times the column block's scale.
__attribute__((always_inline)) inline __m512 widen_column(const Fp8Format&, const uint8_t* col,
                                                          __m512 scale) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(col));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(v), 7),
                                     _mm256_set1_epi16(static_cast<int16_t>(kFp8AsF16Bits)));
  return _mm512_mul_ps(_mm512_maskz_cvtph_ps(kAllLanes, h), scale);
}

// The accumulators of T tokens × P panels from y (rows → pair-order lanes), or zero.
// With `first` (the tile's first k block: nothing is read from y) the lines the tile will
// store are prefetched for writing: an output buffer is mostly cold when a layer's linear
// starts (the experts streamed hundreds of MB through the caches since its last use), and
// the tiles' stores of 64-128 bytes per token row, rows kilobytes apart, would each wait on
// its line's read for ownership. Every linear phase of a batch-64 step gains, W_UK (rows 32
// KB apart) the most (docs/design/cpu_kernels.md; docs/benchmarks.md).
template <int T, int P>
__attribute__((always_inline)) inline void load_accumulators(__m512 (&a0)[T], __m512 (&a1)[T],
                                                             const float* y, int64_t ldy,
                                                             bool first) {
  // lane = row: to_lanes[l] is the row held by lane l.
  const __m512i to_lanes = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    const float* yt = y + t * ldy;
    if (first) {  // the row's first and last line (y rows need not be 64-byte aligned)
      _mm_prefetch(reinterpret_cast<const char*>(yt), _MM_HINT_ET0);
      _mm_prefetch(reinterpret_cast<const char*>(yt + 16 * P - 1), _MM_HINT_ET0);
      if constexpr (P == 2) _mm_prefetch(reinterpret_cast<const char*>(yt + 16), _MM_HINT_ET0);
    }
    a0[t] = first ? _mm512_setzero_ps()
                  : _mm512_maskz_permutexvar_ps(kAllLanes, to_lanes, _mm512_loadu_ps(yt));
    if constexpr (P == 2)
      a1[t] = first ? _mm512_setzero_ps()
                    : _mm512_maskz_permutexvar_ps(kAllLanes, to_lanes, _mm512_loadu_ps(yt + 16));
  }
}

// The accumulators back to y (pair-order lanes → rows).
template <int T, int P>
__attribute__((always_inline)) inline void store_accumulators(const __m512 (&a0)[T],
                                                              const __m512 (&a1)[T], float* y,
                                                              int64_t ldy) {
  // to_rows[r]: the lane holding row r.
  const __m512i to_rows = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    float* yt = y + t * ldy;
    _mm512_storeu_ps(yt, _mm512_maskz_permutexvar_ps(kAllLanes, to_rows, a0[t]));
    if constexpr (P == 2)
      _mm512_storeu_ps(yt + 16, _mm512_maskz_permutexvar_ps(kAllLanes, to_rows, a1[t]));
  }
}

template <int T, int P, int G, class Fmt>
void panel_tile_avx512(const Fmt& f, const float* x, int64_t ldx, const typename Fmt::Elem* w,
                       int64_t kb, int64_t ke, bool first, float* y, int64_t ldy, const char* pf) {
  static_assert(P == 1 || P == 2);
  __m512 a0[T], a1[T];
  load_accumulators<T, P>(a0, a1, y, ldy, first);
  const typename Fmt::Elem* w2 = w + kPanelRows;  // the pair's other panel
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;  // the segment's scales (FP8)
  auto column = [&](int64_t c) __attribute__((always_inline)) {
    const __m512 v = widen_column(f, w + c * kPairStride, s0);
    __m512 v2;
    if constexpr (P == 2) v2 = widen_column(f, w2 + c * kPairStride, s1);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(x[t * ldx + c]);
      a0[t] = _mm512_fmadd_ps(xb, v, a0[t]);
      if constexpr (P == 2) a1[t] = _mm512_fmadd_ps(xb, v2, a1[t]);
    }
  };
  walk_segments<G>(f, kb, ke, pf, column, [&](int64_t c) {
    s0 = _mm512_set1_ps(f.scale(c, 0));
    if constexpr (P == 2) s1 = _mm512_set1_ps(f.scale(c, 1));
  });
  store_accumulators<T, P>(a0, a1, y, ldy);
}

// The wide path, for many tokens: the columns [kb, ke) of panels [p, p + P) are widened once
// into ws [ke - kb][16P] fp32 (each panel's 16 lanes in the pair order above) and read from
// there by every token tile of the block. The narrow tile widens a column again for every
// tile, two port-0/5 instructions beside its T fused multiply-adds; here a column costs P
// loads, T broadcasts (folded into the FMAs) and T × P FMAs: 12 tokens × 2 panels are 24
// accumulators + 2 weights + a broadcast of the 32 registers.
//
// The block's first tile (Widen) reads the panel columns itself, widens them in registers,
// stores them to ws and uses them: the loads of the weights (from DRAM, or L2 when
// prefetched) then overlap that tile's FMAs. A separate widening pass before the tiles would
// have nothing to overlap with and stall on those loads (docs/design/cpu_kernels.md,
// "Measured and not kept").
struct Avx512Wide {
  static constexpr int kMaxTokens = kWideTileTokens;
};

// acc[t][16p + r] (+)= Σ_{c in [kb, ke)} xp[c][t] · W[c][16p + lane(r)]: the sums of
// panel_tile_avx512, in the same order (one FMA per column, ascending c). W: the widened
// block ws [ke - kb][16P]; with Widen, first widened from the panels at w (as the narrow
// tile reads them) into ws. xp: the tile's tokens packed column by column, [cols][T]: the T
// rows of x lie 4 × ldx bytes apart, so with ldx a multiple of 1024 floats all of them map
// to the same L1 set and evict the widened weights. Every G columns a line of the weights'
// next block is prefetched, at pf, as the narrow tile does.
template <int T, int P, int G, bool Widen, class Fmt>
void wide_tile_avx512(const Fmt& f, const float* xp, const typename Fmt::Elem* w, float* ws,
                      int64_t kb, int64_t ke, bool first, float* y, int64_t ldy, const char* pf) {
  static_assert(P == 1 || P == 2);
  __m512 a0[T], a1[T];
  load_accumulators<T, P>(a0, a1, y, ldy, first);
  float* wc = ws - kb * P * kPanelRows;
  const typename Fmt::Elem* w2 = w + kPanelRows;  // the pair's other panel
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;  // the segment's scales (FP8, when widening)
  auto column = [&](int64_t c) __attribute__((always_inline)) {
    float* wcol = wc + c * P * kPanelRows;
    __m512 v, v2;
    if constexpr (Widen) {
      v = widen_column(f, w + c * kPairStride, s0);
      _mm512_store_ps(wcol, v);
      if constexpr (P == 2) {
        v2 = widen_column(f, w2 + c * kPairStride, s1);
        _mm512_store_ps(wcol + kPanelRows, v2);
      }
    } else {
      v = _mm512_load_ps(wcol);
      if constexpr (P == 2) v2 = _mm512_load_ps(wcol + kPanelRows);
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(xp[c * T + t]);
      a0[t] = _mm512_fmadd_ps(xb, v, a0[t]);
      if constexpr (P == 2) a1[t] = _mm512_fmadd_ps(xb, v2, a1[t]);
    }
  };
  walk_segments<G>(f, kb, ke, pf, column, [&](int64_t c) {
    if constexpr (Widen) {
      s0 = _mm512_set1_ps(f.scale(c, 0));
      if constexpr (P == 2) s1 = _mm512_set1_ps(f.scale(c, 1));
    }
  });
  store_accumulators<T, P>(a0, a1, y, ldy);
}
#else
inline constexpr bool kHaveAvx512 = false;
#endif

// One tile of tb tokens (1 ≤ tb ≤ Isa's limit for P) on the instruction set Isa.
template <class Isa, int P, int G, class Fmt>
void tile(const Fmt& f, int tb, const float* x, int64_t ldx, const typename Fmt::Elem* w,
          int64_t kb, int64_t ke, bool first, float* y, int64_t ldy, const char* pf) {
  constexpr int kMax = P == 1 ? Isa::kMaxTokens : Isa::kMaxTokensTwoPanels;
  const bool ran = dispatch_1_to<kMax>(tb, [&]<int T>() {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<Isa, Avx512>)
      panel_tile_avx512<T, P, G>(f, x, ldx, w, kb, ke, first, y, ldy, pf);
#endif
    if constexpr (std::is_same_v<Isa, Avx2>)
      panel_tile_avx2<T, P, G>(f, x, ldx, w, kb, ke, first, y, ldy, pf);
  });
  XDS_CHECK(ran, "panel tile: {} tokens for {} panels", tb, P);
}

#if defined(__AVX512F__)
// One wide tile of tb tokens (1 ≤ tb ≤ Avx512Wide::kMaxTokens).
template <int P, int G, bool Widen, class Fmt>
void wide_tile(const Fmt& f, int tb, const float* xp, const typename Fmt::Elem* w, float* ws,
               int64_t kb, int64_t ke, bool first, float* y, int64_t ldy, const char* pf) {
  const bool ran = dispatch_1_to<Avx512Wide::kMaxTokens>(tb, [&]<int T>() {
    wide_tile_avx512<T, P, G, Widen>(f, xp, w, ws, kb, ke, first, y, ldy, pf);
  });
  XDS_CHECK(ran, "wide panel tile: {} tokens", tb);
}
#endif

}  // namespace xds::kernels::panel_detail

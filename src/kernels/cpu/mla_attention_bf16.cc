// The absorbed attention's bf16 products (AbsorbedQuery::bf16) for a group of nh <= 16
// heads, one per lane. Per slice the cached rows are taken as bf16 rows of latent and rope
// (Bf16SliceRows: bf16 planes in place, fp32 planes converted once into rows [len][W], W =
// C + Dr rounded up to even, zero padded; an odd slice's last row pairs with a zero row), then:
//   scores: part[r][h] = Σ_{c pairs} qp[c/2][h] · (row r's c, c + 1)   (one vdpbf16ps per
//           pair of columns for all 16 heads; qp[c/2][h] = head h's bf16 (q[c], q[c + 1]))
//   softmax as the fp32 kernel (slice_softmax), then p rounded to bf16 in pairs of rows,
//   pp[s/2][h] = (p[s][h], p[s + 1][h]);
//   p·latent: out[h][c0 .. c0 + 16) += Σ_{s pairs} (row s, row s + 1 at c0 .., interleaved)
//           · pp[s/2][h]   (one vdpbf16ps per pair of rows, 16 columns of one head).
// An INT8 latent (LatentKvView::int8()) is read as fp32 planes are: per slice each row is
// converted once, straight from int8 (sign extended, converted, × the row's scale, rounded
// to nearest even: the bits of dequantize_int8_kv_rows then kv_row_to_bf16, the rows the
// tests' reference takes), its rope part from its plane, with the same next-slice prefetch
// over the int8 rows and their scales. Dequantizing 512-row chunks into a compact bf16 copy
// attended and folded chunk by chunk (mla_attention_int8.cc, the fp32 products' path) costs
// that copy's write and re-read, which makes the INT8 cache slower than a bf16 one
// (docs/benchmarks.md). Converting the raw int8 values instead (exact in bf16) and putting
// the scale on each row's score and p would round once (p · scale) where this rounds twice
// (p, and q · scale), but departs from the reference's rounded rows by up to twice the bf16
// tolerance of its test over a one-row context (2.2e-3 against 2.05e-3).
// The rows are read from memory once (prefetched during the slice before) and then from
// L1/L2. The fp32 products and the entry points: mla_attention.cc.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/bf16_pairs.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/mla_absorbed_group.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/mla_slice_rows.h"
#include "kernels/cpu/static_dispatch.h"

namespace xds::kernels {

#if defined(__AVX512BF16__)
namespace {

using absorbed_detail::AbsorbedGroup;
using absorbed_detail::latent_plane_of;
using absorbed_detail::NextSlicePrefetch;
using absorbed_detail::rope_plane_of;
using absorbed_detail::slice_softmax;
using absorbed_detail::SliceRows;
using absorbed_detail::transpose_queries;

// 16 bf16 pairs (a[i], b[i]) in lane i, from two rows of 16 floats.
inline __m512i pair_rows(__m512 a, __m512 b) {
  return interleave_halves(reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}

// bf16 of `count` floats at src into dst (the rest of [count, count_even) zero).
inline void to_bf16(const float* src, int64_t count, uint16_t* dst) {
  int64_t c = 0;
  for (; c + 16 <= count; c += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(src + c))));
  if (c < count) {
    const __mmask16 m = static_cast<__mmask16>((1u << (count - c)) - 1);
    _mm256_mask_storeu_epi16(
        dst + c, m,
        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + c))));
  }
}

// A cached row as bf16 into dst: fp32 rows rounded (to_bf16), bf16 rows copied.
inline void row_to_bf16(const float* src, int64_t count, uint16_t* dst) {
  to_bf16(src, count, dst);
}
inline void row_to_bf16(const uint16_t* src, int64_t count, uint16_t* dst) {
  std::memcpy(dst, src, sizeof(uint16_t) * static_cast<size_t>(count));
}

// An INT8 row as bf16 into dst [count]: q · scale in fp32 (sign extended, converted, one
// multiply: dequantize_int8_kv_rows's value), rounded to nearest even (kv_row_to_bf16's
// rounding), 32 at a time.
inline void int8_row_to_bf16(const int8_t* src, float scale, int64_t count, uint16_t* dst) {
  const __m512 vs = _mm512_set1_ps(scale);
  // The maskz forms: the plain ones trip GCC 12's maybe-uninitialized warning.
  auto widen = [&](__m128i q) {
    return _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, q)),
                         vs);
  };
  auto convert = [&](__m256i q) {
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(widen(_mm256_extracti128_si256(q, 1)),
                                                         widen(_mm256_castsi256_si128(q))));
  };
  int64_t c = 0;
  for (; c + 32 <= count; c += 32)
    _mm512_storeu_si512(dst + c,
                        convert(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c))));
  if (c < count) {
    const __mmask32 m = static_cast<__mmask32>((1ull << (count - c)) - 1);
    _mm512_mask_storeu_epi16(dst + c, m, convert(_mm256_maskz_loadu_epi8(m, src + c)));
  }
}

// Where the bf16 loops take a NextSlicePrefetch step: every 32 columns of a scores tile
// (18 steps per tile at C + Dr = 576: a 128-row slice's 8 tiles take 144) and every 8 row
// pairs of p·latent (8 per pass, 32 passes at C = 512).
constexpr int64_t kColumnsPerPrefetch = 32, kPairsPerPrefetch = 8;

// One tile of R cached rows in bf16: row r's latent at latent + r · latent_ld, its rope part
// at rope + r · rope_ld (rows of a slice's converted copy, or of one block of bf16 planes).
struct Bf16Tile {
  const uint16_t* latent;
  int64_t latent_ld;
  const uint16_t* rope;
  int64_t rope_ld;
};

// part[r][h] for the R rows of `tile` against qp [(lat + dr) / 2][16] pairs: the latent
// columns (lat even), then the rope ones (dr even; the copy path passes lat + dr rounded up
// to even as one plane with dr = 0).
template <int R, class Prefetch>
void bf16_scores_tile(const uint32_t* qp, const Bf16Tile& tile, int64_t lat, int64_t dr,
                      float* part, Prefetch& pf) {
  __m512 a[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
  // Row r read at at[r / 4] + (r % 4) · ld, the pointers stepping on with c: four pointers
  // and the strides in registers. (With a pointer per row GCC spilled them and moved them
  // back for every broadcast.)
  auto plane = [&](const uint16_t* rows, int64_t ld, const uint32_t* q, int64_t cols)
      __attribute__((always_inline)) {
    constexpr int kGroups = (R + 3) / 4;
    const uint16_t* at[kGroups];
#pragma GCC unroll 4
    for (int g = 0; g < kGroups; ++g) at[g] = rows + 4 * g * ld;
    for (int64_t c0 = 0; c0 < cols; c0 += kColumnsPerPrefetch) {
      pf.step();
      for (int64_t c = c0; c < std::min(cols, c0 + kColumnsPerPrefetch); c += 2) {
        const __m512bh qv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + c / 2 * 16));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          int32_t pair;
          std::memcpy(&pair, at[r / 4] + (r % 4) * ld, sizeof pair);
          a[r] = _mm512_dpbf16_ps(a[r], qv, reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)));
        }
#pragma GCC unroll 4
        for (int g = 0; g < kGroups; ++g) at[g] += 2;
      }
    }
  };
  plane(tile.latent, tile.latent_ld, qp, lat);
  if (dr > 0) plane(tile.rope, tile.rope_ld, qp + lat / 2 * 16, dr);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(part + r * 16, a[r]);
}

// out[h][c0 .. c0 + 16) (+)= the slice's p·latent for H heads, the columns masked by `cols`
// (the last block past the whole 32-column ones, bf16_pv_tile32); rows[s]: row s's bf16
// latent (a zero row after an odd slice's last).
template <int H, class Prefetch>
void bf16_pv_tile16(const uint32_t* pp, const uint16_t* const* rows, int64_t pairs, int64_t c0,
                    __mmask16 cols, bool first, float* out, int64_t ldo, Prefetch& pf) {
  __m512 a[H];
#pragma GCC unroll 16
  for (int h = 0; h < H; ++h)
    a[h] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(cols, out + h * ldo + c0);
  // word 2i <- row s's column c0 + i, word 2i + 1 <- row s + 1's (second source: 32 + i)
  const __m512i pair_words =
      _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                       37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  for (int64_t s2 = 0; s2 < pairs; ++s2) {
    if (s2 % kPairsPerPrefetch == 0) pf.step();
    const __m512bh v = reinterpret_cast<__m512bh>(
        _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi16(cols, rows[2 * s2] + c0), pair_words,
                                  _mm512_maskz_loadu_epi16(cols, rows[2 * s2 + 1] + c0)));
    const uint32_t* ps = pp + s2 * 16;
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) {
      const __m512bh p = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ps[h])));
      a[h] = _mm512_dpbf16_ps(a[h], v, p);
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < H; ++h) _mm512_mask_storeu_ps(out + h * ldo + c0, cols, a[h]);
}

// out[h][c0 .. c0 + 32) (+)= the slice's p·latent for H heads, 32 whole columns: per row
// pair one 64-byte load of each row and two vpunpck{l,h}wd, which pair the rows within each
// 128-bit lane, so that the accumulators hold the columns in the order
//   lo: c0 + {0-3, 8-11, 16-19, 24-27},  hi: c0 + {4-7, 12-15, 20-23, 28-31}
// (out is permuted into that order on load and back on store, once per tile). The per-pair
// vpermt2w of the 16-column form (two per row pair and 8 heads, with masked loads) holds the
// p·latent loop further from the bf16 peak from L2 (docs/benchmarks.md). Each column's
// sum is the same vdpbf16ps chain in ascending s: the same bits.
template <int H, class Prefetch>
void bf16_pv_tile32(const uint32_t* pp, const uint16_t* const* rows, int64_t pairs, int64_t c0,
                    bool first, float* out, int64_t ldo, Prefetch& pf) {
  const __m512i to_lo = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
  const __m512i to_hi =
      _mm512_set_epi32(31, 30, 29, 28, 23, 22, 21, 20, 15, 14, 13, 12, 7, 6, 5, 4);
  __m512 lo[H], hi[H];
#pragma GCC unroll 16
  for (int h = 0; h < H; ++h) {
    if (first) {
      lo[h] = hi[h] = _mm512_setzero_ps();
    } else {
      const __m512 x0 = _mm512_loadu_ps(out + h * ldo + c0);
      const __m512 x1 = _mm512_loadu_ps(out + h * ldo + c0 + 16);
      lo[h] = _mm512_permutex2var_ps(x0, to_lo, x1);
      hi[h] = _mm512_permutex2var_ps(x0, to_hi, x1);
    }
  }
  for (int64_t s2 = 0; s2 < pairs; ++s2) {
    if (s2 % kPairsPerPrefetch == 0) pf.step();
    const __m512i r0 = _mm512_loadu_si512(rows[2 * s2] + c0);
    const __m512i r1 = _mm512_loadu_si512(rows[2 * s2 + 1] + c0);
    const __m512bh v_lo = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(r0, r1));
    const __m512bh v_hi = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(r0, r1));
    const uint32_t* ps = pp + s2 * 16;
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) {
      const __m512bh p = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ps[h])));
      lo[h] = _mm512_dpbf16_ps(lo[h], v_lo, p);
      hi[h] = _mm512_dpbf16_ps(hi[h], v_hi, p);
    }
  }
  // Column j of (lo, hi) back in place: c0 + j from lo's or hi's lane (16 + lane).
  const __m512i back0 = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i back1 =
      _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
#pragma GCC unroll 16
  for (int h = 0; h < H; ++h) {
    _mm512_storeu_ps(out + h * ldo + c0, _mm512_permutex2var_ps(lo[h], back0, hi[h]));
    _mm512_storeu_ps(out + h * ldo + c0 + 16, _mm512_permutex2var_ps(lo[h], back1, hi[h]));
  }
}

// Rows per scores tile: 16 accumulators (vdpbf16ps needs more than 12 in flight to reach
// its peak in a register loop: docs/benchmarks.md), one block of 16 cache rows.
constexpr int kBf16ScoreRows = 16;

// A slice's rows as the bf16 kernels read them. bf16 planes with even latent and rope
// widths are read where they are: a tile never crosses a cache block, where rows stop
// being evenly spaced. Otherwise (fp32 planes, an INT8 latent, or odd widths) each row is
// converted or copied once into `copy` as one row [w] (latent, rope, a zero pad to even w)
// and tiles take those rows.
template <typename L, typename R>
class Bf16SliceRows {
 public:
  static constexpr bool kInt8 = std::is_same_v<L, int8_t>;
  // copy, zero: the thread's buffers, resized here.
  Bf16SliceRows(const LatentKvView& kv, int64_t w, std::vector<uint16_t>& copy,
                std::vector<uint16_t>& zero)
      : kv_(kv), w_(w), copy_(copy), zero_(zero) {
    direct_ = std::is_same_v<L, uint16_t> && kv.latent_dim % 2 == 0 && kv.rope_dim % 2 == 0;
    zero_.resize(static_cast<size_t>(w));  // never written: zeros once allocated
    if (!direct_) copy_.resize(static_cast<size_t>(kAbsorbedSliceRows * w));
  }

  // Rows [s0, s0 + len) of the context whose cached rows are latent[i], rope[i] (and, INT8,
  // their scales at *scale[i]).
  void load(const L* const* latent, const R* const* rope, const float* const* scale, int64_t s0,
            int64_t len) {
    s0_ = s0, len_ = len;
    const int64_t lat = kv_.latent_dim, dr = kv_.rope_dim;
    for (int64_t s = 0; s < len; ++s) {
      if constexpr (std::is_same_v<L, uint16_t>) {
        if (direct_) {
          latent_[s] = latent[s], rope_[s] = rope[s];
          continue;
        }
      }
      uint16_t* row = copy_.data() + s * w_;
      if constexpr (kInt8) {
        int8_row_to_bf16(latent[s], *scale[s], lat, row);
      } else {
        row_to_bf16(latent[s], lat, row);
      }
      if (dr > 0) row_to_bf16(rope[s], dr, row + lat);
      if (lat + dr < w_) row[w_ - 1] = 0;
      latent_[s] = row;  // the rope part follows in the same row (one plane for tiles)
    }
    latent_[len] = zero_.data();  // an odd slice's last row pairs with zeros
  }

  // Scores of all the slice's rows into part [len][16], in tiles of at most Rows rows.
  template <int Rows, class Prefetch>
  void scores(const uint32_t* qp, float* part, Prefetch& pf) const {
    const int64_t lat = kv_.latent_dim, dr = kv_.rope_dim, bs = kv_.block_size;
    for (int64_t r = 0; r < len_;) {
      int64_t n = std::min<int64_t>(Rows, len_ - r);
      if (direct_) n = std::min(n, bs - (s0_ + r) % bs);
      const Bf16Tile tile = direct_ ? Bf16Tile{latent_[r], kv_.latent_stride(), rope_[r], dr}
                                    : Bf16Tile{latent_[r], w_, nullptr, 0};
      const int64_t tile_lat = direct_ ? lat : w_, tile_dr = direct_ ? dr : 0;
      dispatch_1_to<Rows>(static_cast<int>(n), [&]<int N>() {
        bf16_scores_tile<N>(qp, tile, tile_lat, tile_dr, part + r * 16, pf);
      });
      r += n;
    }
  }

  const uint16_t* const* latent_rows() const { return latent_; }

 private:
  const LatentKvView& kv_;
  int64_t w_, s0_ = 0, len_ = 0;
  bool direct_ = false;
  std::vector<uint16_t>& copy_;
  std::vector<uint16_t>& zero_;
  const uint16_t* latent_[kAbsorbedSliceRows + 1];
  const uint16_t* rope_[kAbsorbedSliceRows + 1];
};

// L, R: the latent and rope planes' elements (float; uint16_t for bf16 planes, then read in
// place or copied instead of rounded: the same bf16 rows; int8_t for an INT8 latent,
// dequantized and rounded per row as it is copied).
template <typename L, typename R>
void attend_planes(const AbsorbedGroup& grp) {
  const LatentKvView& kv = grp.kv;
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim, w = (lat + dr + 1) / 2 * 2;
  const int64_t nh = grp.nh, s_begin = grp.s_begin, s_end = grp.s_end, out_ld = grp.out_ld;
  float* qt = grp.qt;
  float* out = grp.out;
  transpose_queries(grp.q, grp.h0, nh, lat, dr, 16, qt);  // [lat + dr][16] fp32
  thread_local std::vector<uint32_t> qp;                  // [w / 2][16] pairs
  thread_local std::vector<uint32_t> pp;                  // [slice rows / 2][16] pairs
  qp.resize(static_cast<size_t>(w / 2 * 16));
  pp.resize(static_cast<size_t>((kAbsorbedSliceRows + 1) / 2 * 16));
  for (int64_t c = 0; c < w; c += 2) {
    const __m512 a = _mm512_loadu_ps(qt + c * 16);
    const __m512 b = c + 1 < lat + dr ? _mm512_loadu_ps(qt + (c + 1) * 16) : _mm512_setzero_ps();
    _mm512_storeu_si512(qp.data() + c / 2 * 16, pair_rows(a, b));
  }
  thread_local std::vector<uint16_t> copy, zero;
  Bf16SliceRows<L, R> rows(kv, w, copy, zero);
  alignas(64) float sc[(kAbsorbedSliceRows + 1) * 16];  // scores, then p: [len (even)][16]
  // Slices of whole 16-row blocks (slice_rows_of), so that the tiles of bf16 planes are whole.
  // The next slice's rows are prefetched during this one; during the last, the first rows
  // of the thread's next call if given.
  SliceRows<L, R> slice(kv, latent_plane_of<L>(kv), rope_plane_of<R>(kv), s_begin, s_end, grp.next);
  NextSlicePrefetch<L, R> pf;
  for (int64_t s0 = s_begin; s0 < s_end; s0 += slice.slice_rows(), slice.advance()) {
    const int64_t s1 = std::min(s_end, s0 + slice.slice_rows()), len = s1 - s0;
    const int64_t even = (len + 1) / 2 * 2;
    slice.begin(s1);
    pf.start(slice.next_latent(), slice.next_rope(), slice.ahead(), lat, dr, slice.next_scale());
    rows.load(slice.latent(), slice.rope(), slice.scale(), s0, len);
    rows.template scores<kBf16ScoreRows>(qp.data(), sc, pf);
    const bool first = s0 == s_begin;
    slice_softmax(grp, sc, len, 16, first);
    for (int64_t s = 0; s < even; s += 2) {
      const __m512 b = s + 1 < len ? _mm512_loadu_ps(sc + (s + 1) * 16) : _mm512_setzero_ps();
      _mm512_storeu_si512(pp.data() + s / 2 * 16, pair_rows(_mm512_loadu_ps(sc + s * 16), b));
    }
    // 32 columns × up to 8 heads (16 heads as 8 + 8): per row pair two unpacks and 8
    // broadcasts for 16 vdpbf16ps (bf16_pv_tile32). A last block of up to 16 columns takes
    // all heads at once.
    const int64_t lat32 = lat / 32 * 32;
    for (int64_t c0 = 0; c0 < lat32; c0 += 32) {
      for (int64_t g = 0; g < nh; g += 8) {
        dispatch_1_to<8>(static_cast<int>(std::min<int64_t>(8, nh - g)), [&]<int H>() {
          bf16_pv_tile32<H>(pp.data() + g, rows.latent_rows(), even / 2, c0, first,
                            out + g * out_ld, out_ld, pf);
        });
      }
    }
    for (int64_t c0 = lat32; c0 < lat; c0 += 16) {
      const __mmask16 cols =
          static_cast<__mmask16>(lat - c0 >= 16 ? 0xffff : (1u << (lat - c0)) - 1);
      dispatch_1_to<16>(static_cast<int>(nh), [&]<int H>() {
        bf16_pv_tile16<H>(pp.data(), rows.latent_rows(), even / 2, c0, cols, first, out, out_ld,
                          pf);
      });
    }
  }
}

}  // namespace

void absorbed_detail::attend_group_bf16(const AbsorbedGroup& g) {
  if (g.kv.int8()) {
    if (g.kv.rope16 != nullptr) return attend_planes<int8_t, uint16_t>(g);
    return attend_planes<int8_t, float>(g);
  }
  if (g.kv.bf16()) return attend_planes<uint16_t, uint16_t>(g);
  attend_planes<float, float>(g);
}

void kv_row_to_bf16(const float* src, int64_t count, uint16_t* dst) {
  to_bf16(src, count, dst);
}

bool absorbed_bf16_available() {
  return panel_isa() == PanelIsa::kAvx512;
}

#else  // no AVX512_BF16: absorbed_bf16_available() is false, the fp32 products run

void absorbed_detail::attend_group_bf16(const AbsorbedGroup&) {
  XDS_CHECK(false, "absorbed attention: this build has no AVX512_BF16");
}

void kv_row_to_bf16(const float*, int64_t, uint16_t*) {
  XDS_CHECK(false, "kv_row_to_bf16: this build has no AVX512_BF16");
}

bool absorbed_bf16_available() {
  return false;
}

#endif

}  // namespace xds::kernels

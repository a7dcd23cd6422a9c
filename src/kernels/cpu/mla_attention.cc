#include "kernels/cpu/mla_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/bf16_pairs.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/mla_slice_rows.h"
#include "kernels/cpu/simd_ops.h"
#include "kernels/cpu/static_dispatch.h"
#include "kernels/cpu/transpose16.h"
#include "kernels/cpu/vec_math.h"

namespace xds::kernels {

namespace {

using absorbed_detail::NextSlicePrefetch;
using absorbed_detail::SliceRows;

// Scores of R cached rows × NV·L heads (L = Ops::kLanes: 8 with AVX2, 16 with AVX-512)
// over the `cols` columns of one plane (latent or rope), vectorised over heads:
//   part[r][v] (+)= Σ_{c < cols} qt[c][v] · rows[r][c]
// qt: the plane's transposed queries [cols][NV · L]; part: [R][NV · L], loaded unless
// `first`. One broadcast and NV fused multiply-adds per row and column, in ascending c:
// whatever Ops or R, every score is one FMA per column in the same order (the latent
// plane, then the rope plane), so the same bits.
// Every 16 columns it prefetches one line of each of the R rows at `next` (the tile that
// runs after this one): the cached rows come from DRAM, and hardware prefetch alone left
// the kernel at ~60 % of its speed.
template <class Ops, int NV, int R>
void scores_tile(const float* qt, const float* const* rows, const float* const* next, int64_t cols,
                 bool first, float* part) {
  static_assert(NV == 1 || NV == 2);
  using V = typename Ops::V;
  constexpr int kW = NV * Ops::kLanes;
  // One-dimensional accumulator arrays (heads 0-7 in a0, 8-15 in a1 with AVX2), every loop
  // over r unrolled: GCC then keeps them in registers. With acc[R][NV] it also stored all of
  // them to the stack on every c (one store per FMA pair; the kernel ran at ~30 % of peak).
  V a0[R], a1[R];
  const float* l[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    a0[r] = first ? Ops::zero() : Ops::load(part + r * kW);
    a1[r] = a0[r];
    if constexpr (NV == 2) a1[r] = first ? Ops::zero() : Ops::load(part + r * kW + Ops::kLanes);
    l[r] = rows[r];
  }
  auto accumulate = [&](int64_t c) __attribute__((always_inline)) {
    const V q0 = Ops::load(qt + c * kW);
    V q1 = q0;
    if constexpr (NV == 2) q1 = Ops::load(qt + c * kW + Ops::kLanes);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const V b = Ops::set1(l[r][c]);
      a0[r] = Ops::fma(b, q0, a0[r]);
      if constexpr (NV == 2) a1[r] = Ops::fma(b, q1, a1[r]);
    }
  };
  // 16 columns (one line of each row) per outer step: the prefetches go there, and the
  // inner loop needs only the row pointers, which GCC then keeps in registers (with the
  // prefetch test inside it reloaded them from the stack for every broadcast).
  int64_t c0 = 0;
  for (; c0 + 16 <= cols; c0 += 16) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(next[r] + c0), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int64_t c = c0; c < c0 + 16; ++c) accumulate(c);
  }
  for (int64_t c = c0; c < cols; ++c) accumulate(c);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    Ops::store(part + r * kW, a0[r]);
    if constexpr (NV == 2) Ops::store(part + r * kW + Ops::kLanes, a1[r]);
  }
}

// qt[c][j] = the absorbed query of head h0 + j at column c (latent, then rope), zero for
// j >= nh: [C + Dr, kW].
void transpose_queries(const AbsorbedQuery& q, int64_t h0, int64_t nh, int64_t lat, int64_t dr,
                       int64_t kw, float* qt) {
#if defined(__AVX512F__)
  if (kw == 16 && panel_isa() == PanelIsa::kAvx512) {  // 16 × 16 blocks in registers
    transpose_row_tiles(q.q_abs + h0 * q.q_abs_ld, q.q_abs_ld, nh, lat, 0, qt, 0);
    transpose_row_tiles(q.q_pe + h0 * q.q_pe_ld, q.q_pe_ld, nh, dr, lat, qt, 0);
    return;
  }
#endif
  for (int64_t c = 0; c < lat + dr; ++c) {
    for (int64_t j = 0; j < kw; ++j) {
      qt[c * kw + j] = j >= nh   ? 0.0f
                       : c < lat ? q.q_abs[(h0 + j) * q.q_abs_ld + c]
                                 : q.q_pe[(h0 + j) * q.q_pe_ld + (c - lat)];
    }
  }
}

// Scores of a slice's len rows (at most kAbsorbedSliceRows; latent and rope row pointers)
// into part [len][NV · L]: the latent plane, then the rope plane, each in tiles of R rows
// (the rest, < R, in one tile). A tile prefetches the next one's rows; the last tile of each
// plane the first rows of that plane after the slice (`after_latent`, `after_rope`: ahead
// of them; none: its own last row again).
// Whole latent rows per tile: column blocks of 64 (the queries' block staying in L1) ran
// ~16 % faster from L2 but ~10 % slower from DRAM, where batch 64 reads them.
template <class Ops, int NV, int R>
void slice_scores(const float* qt, const float* const* latent, const float* const* rope,
                  int64_t len, int64_t lat, int64_t dr, const float* const* after_latent,
                  const float* const* after_rope, int64_t ahead, float* part) {
  constexpr int kW = NV * Ops::kLanes;
  // Row pointers, each plane followed by R more for the prefetches after its last tile.
  const float* lrow[kAbsorbedSliceRows + R];
  const float* rrow[kAbsorbedSliceRows + R];
  std::copy_n(latent, len, lrow);
  if (dr > 0) std::copy_n(rope, len, rrow);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = std::min(r, ahead - 1);
    lrow[len + r] = ahead > 0 ? after_latent[i] : latent[len - 1];
    if (dr > 0) rrow[len + r] = ahead > 0 ? after_rope[i] : rope[len - 1];
  }
  auto plane = [&](const float* const* rows, const float* q, int64_t cols, bool first) {
    for (int64_t s = 0; s < len; s += R) {
      // The next tile's rows: rows[s + R ..], clamped to the R after the plane's last.
      const float* next[R];
      for (int r = 0; r < R; ++r) next[r] = rows[std::min(len, s + R) + r];
      if (s + R <= len) {
        scores_tile<Ops, NV, R>(q, rows + s, next, cols, first, part + s * kW);
      } else {
        dispatch_1_to<R - 1>(static_cast<int>(len - s), [&]<int Rest>() {
          scores_tile<Ops, NV, Rest>(q, rows + s, next, cols, first, part + s * kW);
        });
      }
    }
  };
  plane(lrow, qt, lat, true);
  if (dr > 0) plane(rrow, qt + lat * kW, dr, false);
}

#if defined(__AVX512F__)
// DeepSeek-V3's cache rows (C = 512, padded to kStridedLatentLd; Dr = 64) have strides
// known at compile time: within one cache block row r of a tile sits at rows + r · Ld, and
// every broadcast becomes an FMA operand [rows + constant] off one base register. The
// pointer-per-row tile (scores_tile) holds 12 pointers in registers and no more fit; this
// one takes a whole 16-row block at once (16 accumulators of 32 registers), so the query
// load per column serves 16 rows, not 12. Hot single thread, 256 rows: 240 against 214
// GFLOP/s (a run-time stride: 210, the addresses then cost instructions).
// part[r][h] (+)= Σ_{c < cols} qt[c][h] · rows[r · Ld + c], ascending c, one FMA per column:
// the same bits as scores_tile. Prefetches one line of each of 16 rows at `next` per 16
// columns (the tile after this one: rows beyond a short next tile are harmless hints).
constexpr int64_t kStridedLatentDim = 512, kStridedRopeDim = 64;
constexpr int64_t kStridedLatentLd = padded_latent_stride(kStridedLatentDim);  // 528

template <int R, int64_t Ld>
void strided_scores_tile(const float* qt, const float* rows, const float* next, int64_t cols,
                         bool first, float* part) {
  __m512 a[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) a[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + r * 16);
  static_assert(kStridedLatentDim % 16 == 0 && kStridedRopeDim % 16 == 0);
  for (int64_t c0 = 0; c0 < cols; c0 += 16) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(next + r * Ld + c0), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int64_t c = c0; c < c0 + 16; ++c) {
      const __m512 q = _mm512_loadu_ps(qt + c * 16);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(rows[r * Ld + c]), q, a[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(part + r * 16, a[r]);
}

// slice_scores for the strided shape: tiles are runs of up to 16 rows that lie Ld apart
// (one cache block's rows, whole blocks where blocks are 16 rows and slices start on one).
// Each tile prefetches the next one's rows, as slice_scores.
void strided_slice_scores(const float* qt, const float* const* latent, const float* const* rope,
                          int64_t len, const float* const* after_latent,
                          const float* const* after_rope, int64_t ahead, float* part) {
  auto plane = [&]<int64_t Ld>(const float* const* rows, const float* q, int64_t cols, bool first,
                               const float* following) {
    for (int64_t s = 0; s < len;) {
      int64_t e = s + 1;
      while (e < len && e - s < 16 && rows[e] == rows[e - 1] + Ld) ++e;
      dispatch_1_to<16>(static_cast<int>(e - s), [&]<int R>() {
        strided_scores_tile<R, Ld>(q, rows[s], e < len ? rows[e] : following, cols, first,
                                   part + s * 16);
      });
      s = e;
    }
  };
  plane.template operator()<kStridedLatentLd>(latent, qt, kStridedLatentDim, true,
                                              ahead > 0 ? after_latent[0] : latent[0]);
  plane.template operator()<kStridedRopeDim>(rope, qt + kStridedLatentDim * 16, kStridedRopeDim,
                                             false, ahead > 0 ? after_rope[0] : rope[0]);
}

bool strided_shape(const LatentKvView& kv) {
  return kv.latent_dim == kStridedLatentDim && kv.latent_stride() == kStridedLatentLd &&
         kv.rope_dim == kStridedRopeDim;
}
#endif

// The scores of a group of nh heads whose transposed queries are kw (8 or 16) wide. 12
// accumulators per tile: with 8 (AVX2, R = 4) the FMA chains left the kernel at ~55 % of
// peak. AVX-512 holds 16 heads in one register.
void group_scores(const float* qt, int64_t kw, const LatentKvView& kv,
                  const SliceRows<float>& slice, int64_t len, float* sc) {
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  const float* const* lrow = slice.latent();
  const float* const* rrow = slice.rope();
  const float* const* al = slice.next_latent();
  const float* const* ar = slice.next_rope();
  const int64_t ahead = slice.ahead();
#if defined(__AVX512F__)
  if (kw == 16 && panel_isa() == PanelIsa::kAvx512) {
    if (strided_shape(kv)) return strided_slice_scores(qt, lrow, rrow, len, al, ar, ahead, sc);
    return slice_scores<Avx512Ops, 1, 12>(qt, lrow, rrow, len, lat, dr, al, ar, ahead, sc);
  }
#endif
  if (kw == 16) return slice_scores<Avx2Ops, 2, 6>(qt, lrow, rrow, len, lat, dr, al, ar, ahead, sc);
  slice_scores<Avx2Ops, 1, 12>(qt, lrow, rrow, len, lat, dr, al, ar, ahead, sc);
}

// out[h][c0 .. c0 + NC·L) (+)= Σ_{s in [s0, s1)} p[s][h] · latent(s)[c0 ..] for H heads
// (L = Ops::kLanes; p: the slice's probabilities [len][kw], head-interleaved as the scores
// left them): NC·H accumulators, per s NC loads of the latent row and H broadcasts of p
// (with AVX-512 folded into the FMAs: the H values share one line). Sums run in ascending s
// with one FMA each, starting from out (or from zero when `first`), whatever Ops, H or NC:
// the same bits.
template <class Ops, int H, int NC>
void pv_tile(const float* p, int64_t kw, const float* const* rows, int64_t len, int64_t c0,
             bool first, float* out, int64_t ldo) {
  static_assert(NC >= 1 && NC <= 4);
  using V = typename Ops::V;
  constexpr int kL = Ops::kLanes;
  V a[NC * H];  // a[n * H + h]: head h, columns c0 + n·L ..
#pragma GCC unroll 32
  for (int i = 0; i < NC * H; ++i)
    a[i] = first ? Ops::zero() : Ops::load(out + (i % H) * ldo + c0 + (i / H) * kL);
  for (int64_t s = 0; s < len; ++s) {
    const float* row = rows[s] + c0;
    const float* ps = p + s * kw;
    V l[NC];
#pragma GCC unroll 4
    for (int n = 0; n < NC; ++n) l[n] = Ops::load(row + n * kL);
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h) {
      const V w = Ops::set1(ps[h]);
#pragma GCC unroll 4
      for (int n = 0; n < NC; ++n) a[n * H + h] = Ops::fma(w, l[n], a[n * H + h]);
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < NC * H; ++i) Ops::store(out + (i % H) * ldo + c0 + (i / H) * kL, a[i]);
}

// Columns [c_begin, c_end) (a multiple of NC·L) of p·latent in pv_tile tiles: nh heads in
// tiles of at most MaxH, as even as possible (16 heads as 6 + 5 + 5).
template <class Ops, int MaxH, int NC>
void pv_columns(const float* p, int64_t kw, int64_t nh, const float* const* rows, int64_t len,
                int64_t c_begin, int64_t c_end, bool first, float* out, int64_t ldo) {
  for (int64_t c0 = c_begin; c0 < c_end; c0 += NC * Ops::kLanes) {
    for (int64_t h0 = 0; h0 < nh;) {
      const int64_t left = nh - h0, tiles = (left + MaxH - 1) / MaxH;
      const int h = static_cast<int>((left + tiles - 1) / tiles);
      dispatch_1_to<MaxH>(h, [&]<int H>() {
        pv_tile<Ops, H, NC>(p + h0, kw, rows, len, c0, first, out + h0 * ldo, ldo);
      });
      h0 += h;
    }
  }
}

// out[h] (+)= Σ_{s < len} p[s][h] · rows[s] for nh heads: [nh, len]·[len, C] (`first`: out
// starts from zero). Every output is summed in ascending s with one FMA per position,
// whatever the tiling.
void pv_slice(const float* p, int64_t kw, int64_t nh, const float* const* rows, int64_t len,
              int64_t lat, bool first, float* out, int64_t ldo) {
  const int64_t lat16 = lat / 16 * 16;
  // Columns past the last multiple of 16 (none at C = 512; small test models), one by one.
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t c = lat16; c < lat; ++c) {
      float acc = first ? 0.0f : out[h * ldo + c];
      for (int64_t s = 0; s < len; ++s) acc = std::fma(p[s * kw + h], rows[s][c], acc);
      out[h * ldo + c] = acc;
    }
  }
#if defined(__AVX512F__)
  // 48 columns × up to 8 heads (24 + 3 of 32 registers; 16 heads as 8 + 8): per row three
  // latent loads and 8 broadcasts for 24 FMAs; 32 columns × 8 heads (two loads and 8
  // broadcasts for 16 FMAs) where 48 do not fit, and 16 columns × 16 heads for a last 16.
  // 48 columns against 32 at C = 512 (480 + 32): 8.0 → 7.6 µs for 128 rows from L2 (hot
  // single-thread harness, 262 → 275 GFLOP/s); 16 × 16 (one load, 16 broadcasts) ran ~7 %
  // slower than 32 × 8 from L2.
  if (panel_isa() == PanelIsa::kAvx512) {
    const int64_t lat32 = lat16 / 32 * 32, lat48 = lat32 / 48 * 48;
    pv_columns<Avx512Ops, 8, 3>(p, kw, nh, rows, len, 0, lat48, first, out, ldo);
    if (lat32 - lat48 == 32)
      pv_columns<Avx512Ops, 8, 2>(p, kw, nh, rows, len, lat48, lat32, first, out, ldo);
    // the last 16 of lat32 (lat32 − lat48 = 16), then of lat16
    pv_columns<Avx512Ops, 16, 1>(p, kw, nh, rows, len, lat32 - lat48 == 16 ? lat48 : lat32, lat16,
                                 first, out, ldo);
    return;
  }
#endif
  // 16 columns × up to 6 heads (14 of 16 registers)
  pv_columns<Avx2Ops, 6, 2>(p, kw, nh, rows, len, 0, lat16, first, out, ldo);
}

// The slice's softmax step on the scores sc [len][kw] (head j in lane j): sc = e^(scale ·
// sc - m_new[j]) with m_new the running max per head, l[j] = l[j] · e^(m[j] - m_new[j]) +
// Σ_s sc[s][j] (ascending s), out rows rescaled by e^(m[j] - m_new[j]) when the max grew
// (`first`: m, l start from this slice). Eight heads at a time with exp_avx2, or 16 with
// exp_avx512 where the AVX-512 kernels run and the scores are 16 wide: the same steps per
// lane, so the same bits.
void slice_softmax(float* sc, int64_t len, int64_t kw, int64_t nh, float scale, bool first,
                   float* m, float* l, float* out, int64_t out_ld, int64_t lat) {
  // Per head once the slice's max and sum are known: l and the rescaled output rows.
  auto update = [&](int64_t h, float m_new, float sum) {
    if (first) {
      l[h] = sum;
    } else {
      const float alpha = std::exp(m[h] - m_new);
      l[h] = l[h] * alpha + sum;
      float* o = out + h * out_ld;
      for (int64_t c = 0; c < lat; ++c) o[c] *= alpha;
    }
    m[h] = m_new;
  };
#if defined(__AVX512F__)
  if (kw == 16 && panel_isa() == PanelIsa::kAvx512) {
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t s = 0; s < len; ++s) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sc + s * 16), vs);
      _mm512_storeu_ps(sc + s * 16, x);
      mx = _mm512_maskz_max_ps(0xffff, mx, x);  // the plain form trips GCC 12's warning
    }
    alignas(64) float m_new[16];
    _mm512_store_ps(m_new, mx);
    if (!first) {
      for (int64_t j = 0; j < nh; ++j) m_new[j] = std::max(m[j], m_new[j]);
    }
    const __m512 shift = _mm512_load_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t s = 0; s < len; ++s) {
      const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(sc + s * 16), shift));
      _mm512_storeu_ps(sc + s * 16, e);
      sum = _mm512_add_ps(sum, e);
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, sum);
    for (int64_t j = 0; j < nh; ++j) update(j, m_new[j], sums[j]);
    return;
  }
#endif
  for (int64_t j0 = 0; j0 < nh; j0 += 8) {
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t s = 0; s < len; ++s) {
      float* v = sc + s * kw + j0;
      const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(v), vs);
      _mm256_storeu_ps(v, x);
      mx = _mm256_max_ps(mx, x);
    }
    alignas(32) float m_new[8];
    _mm256_store_ps(m_new, mx);
    const int64_t heads = std::min<int64_t>(8, nh - j0);
    if (!first) {
      for (int64_t j = 0; j < heads; ++j) m_new[j] = std::max(m[j0 + j], m_new[j]);
    }
    const __m256 shift = _mm256_load_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t s = 0; s < len; ++s) {
      float* v = sc + s * kw + j0;
      const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(v), shift));
      _mm256_storeu_ps(v, e);
      sum = _mm256_add_ps(sum, e);
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, sum);
    for (int64_t j = 0; j < heads; ++j) update(j0 + j, m_new[j], sums[j]);
  }
}

#if defined(__AVX512BF16__)
// The bf16 products (AbsorbedQuery::bf16) for a group of nh <= 16 heads, one per lane.
// Per slice the cached rows are taken as bf16 rows of latent and rope (Bf16SliceRows:
// bf16 planes in place, fp32 planes converted once into rows [len][W], W = C + Dr rounded up
// to even, zero padded; an odd slice's last row pairs with a zero row), then:
//   scores: part[r][h] = Σ_{c pairs} qp[c/2][h] · (row r's c, c + 1)   (one vdpbf16ps per
//           pair of columns for all 16 heads; qp[c/2][h] = head h's bf16 (q[c], q[c + 1]))
//   softmax as the fp32 kernel (slice_softmax), then p rounded to bf16 in pairs of rows,
//   pp[s/2][h] = (p[s][h], p[s + 1][h]);
//   p·latent: out[h][c0 .. c0 + 16) += Σ_{s pairs} (row s, row s + 1 at c0 .., interleaved)
//           · pp[s/2][h]   (one vdpbf16ps per pair of rows, 16 columns of one head).
// The rows are read from memory once (prefetched during the slice before) and then from
// L1/L2.

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
// vpermt2w of the 16-column form (two per row pair and 8 heads, with masked loads) held the
// p·latent loop at ~67 % of the bf16 peak from L2; this one runs ~10 % faster. Each column's
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

// Rows per scores tile: 16 accumulators (vdpbf16ps needs more than 12 in flight: 12 left it
// ~8 % short of peak in a register loop), one block of 16 cache rows.
constexpr int kBf16ScoreRows = 16;

// A slice's rows as the bf16 kernels read them. bf16 planes with even latent and rope
// widths are read where they are: a tile never crosses a cache block, where rows stop
// being evenly spaced. Otherwise (fp32 planes, or odd widths) each row is converted or
// copied once into `copy` as one row [w] (latent, rope, a zero pad to even w) and tiles take
// those rows.
template <typename T>
class Bf16SliceRows {
 public:
  // copy, zero: the thread's buffers, resized here.
  Bf16SliceRows(const LatentKvView& kv, int64_t w, std::vector<uint16_t>& copy,
                std::vector<uint16_t>& zero)
      : kv_(kv), w_(w), copy_(copy), zero_(zero) {
    direct_ = std::is_same_v<T, uint16_t> && kv.latent_dim % 2 == 0 && kv.rope_dim % 2 == 0;
    zero_.resize(static_cast<size_t>(w));  // never written: zeros once allocated
    if (!direct_) copy_.resize(static_cast<size_t>(kAbsorbedSliceRows * w));
  }

  // Rows [s0, s0 + len) of the context whose cached rows are latent[i], rope[i].
  void load(const T* const* latent, const T* const* rope, int64_t s0, int64_t len) {
    s0_ = s0, len_ = len;
    const int64_t lat = kv_.latent_dim, dr = kv_.rope_dim;
    for (int64_t s = 0; s < len; ++s) {
      if constexpr (std::is_same_v<T, uint16_t>) {
        if (direct_) {
          latent_[s] = latent[s], rope_[s] = rope[s];
          continue;
        }
      }
      uint16_t* row = copy_.data() + s * w_;
      row_to_bf16(latent[s], lat, row);
      if (dr > 0) row_to_bf16(rope[s], dr, row + lat);
      if (lat + dr < w_) row[w_ - 1] = 0;
      latent_[s] = row;  // the rope part follows in the same row (one plane for tiles)
    }
    latent_[len] = zero_.data();  // an odd slice's last row pairs with zeros
  }

  // Scores of all the slice's rows into part [len][16], in tiles of at most R rows.
  template <int R, class Prefetch>
  void scores(const uint32_t* qp, float* part, Prefetch& pf) const {
    const int64_t lat = kv_.latent_dim, dr = kv_.rope_dim, bs = kv_.block_size;
    for (int64_t r = 0; r < len_;) {
      int64_t n = std::min<int64_t>(R, len_ - r);
      if (direct_) n = std::min(n, bs - (s0_ + r) % bs);
      const Bf16Tile tile = direct_ ? Bf16Tile{latent_[r], kv_.latent_stride(), rope_[r], dr}
                                    : Bf16Tile{latent_[r], w_, nullptr, 0};
      const int64_t tile_lat = direct_ ? lat : w_, tile_dr = direct_ ? dr : 0;
      dispatch_1_to<R>(static_cast<int>(n), [&]<int N>() {
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

// T: the planes' element (float, or uint16_t for bf16 planes, then read in place or copied
// instead of rounded: the same bf16 rows).
template <typename T>
void attend_group_bf16(const AbsorbedQuery& q, int64_t h0, int64_t nh, const LatentKvView& kv,
                       const T* latent_plane, const T* rope_plane, int64_t s_begin, int64_t s_end,
                       float scale, float* qt, float* out, int64_t out_ld, float* m, float* l,
                       const AbsorbedNextRows* next) {
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim, w = (lat + dr + 1) / 2 * 2;
  transpose_queries(q, h0, nh, lat, dr, 16, qt);  // [lat + dr][16] fp32
  thread_local std::vector<uint32_t> qp;          // [w / 2][16] pairs
  thread_local std::vector<uint32_t> pp;          // [slice rows / 2][16] pairs
  qp.resize(static_cast<size_t>(w / 2 * 16));
  pp.resize(static_cast<size_t>((kAbsorbedSliceRows + 1) / 2 * 16));
  for (int64_t c = 0; c < w; c += 2) {
    const __m512 a = _mm512_loadu_ps(qt + c * 16);
    const __m512 b = c + 1 < lat + dr ? _mm512_loadu_ps(qt + (c + 1) * 16) : _mm512_setzero_ps();
    _mm512_storeu_si512(qp.data() + c / 2 * 16, pair_rows(a, b));
  }
  thread_local std::vector<uint16_t> copy, zero;
  Bf16SliceRows<T> rows(kv, w, copy, zero);
  alignas(64) float sc[(kAbsorbedSliceRows + 1) * 16];  // scores, then p: [len (even)][16]
  // Slices of whole 16-row blocks (slice_rows_of), so that the tiles of bf16 planes are whole.
  // The next slice's rows are prefetched during this one; during the last, the first rows
  // of the thread's next call if given.
  SliceRows<T> slice(kv, latent_plane, rope_plane, s_begin, s_end, next);
  NextSlicePrefetch<T> pf;
  for (int64_t s0 = s_begin; s0 < s_end; s0 += slice.slice_rows(), slice.advance()) {
    const int64_t s1 = std::min(s_end, s0 + slice.slice_rows()), len = s1 - s0;
    const int64_t even = (len + 1) / 2 * 2;
    slice.begin(s1);
    pf.start(slice.next_latent(), slice.next_rope(), slice.ahead(), lat, dr);
    rows.load(slice.latent(), slice.rope(), s0, len);
    rows.template scores<kBf16ScoreRows>(qp.data(), sc, pf);
    const bool first = s0 == s_begin;
    slice_softmax(sc, len, 16, nh, scale, first, m, l, out, out_ld, lat);
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
#endif

// One group of nh <= 16 heads over context rows [s_begin, s_end), in slices of
// kAbsorbedSliceRows rows; per slice the scores (the rows come from DRAM, prefetched), an
// online softmax (running max m and sum l per head; out rescaled by exp(m_old - m_new) when
// the max grows), then p·latent while the slice's rows are still in L2. Each cached row is
// read from memory once. Leaves out unnormalised: out[h] = Σ_s e^(score - m[h]) latent(s),
// l[h] = Σ_s e^(score - m[h]).
void attend_group(const AbsorbedQuery& q, int64_t h0, int64_t nh, const LatentKvView& kv,
                  int64_t s_begin, int64_t s_end, float scale, float* qt, float* out,
                  int64_t out_ld, float* m, float* l, const AbsorbedNextRows* next) {
#if defined(__AVX512BF16__)
  if (q.bf16 && absorbed_bf16_available()) {
    if (kv.bf16()) {
      return attend_group_bf16(q, h0, nh, kv, kv.latent16, kv.rope16, s_begin, s_end, scale, qt,
                               out, out_ld, m, l, next);
    }
    return attend_group_bf16(q, h0, nh, kv, kv.latent, kv.rope, s_begin, s_end, scale, qt, out,
                             out_ld, m, l, next);
  }
#endif
  XDS_CHECK(!kv.bf16(),
            "absorbed attention: bf16 KV planes are read only by the bf16 products "
            "(AVX512_BF16 and the AVX-512 panel ISA)");
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  const int64_t kw = nh > 8 ? 16 : 8;
  transpose_queries(q, h0, nh, lat, dr, kw, qt);
  alignas(64) float sc[kAbsorbedSliceRows * 16];  // the slice's scores, then p: [len][kw]
  // Each scores tile prefetches the next tile's rows; the last one the first rows of the
  // next slice (of the thread's next call after the last slice). Prefetching a whole slice
  // ahead, spread over the scores and p·latent as the bf16 products do, ran 20 % slower
  // cold (bench_attention, 64 sequences, both 16- and 9-line bursts).
  SliceRows<float> slice(kv, kv.latent, kv.rope, s_begin, s_end, next);
  for (int64_t s0 = s_begin; s0 < s_end; s0 += slice.slice_rows(), slice.advance()) {
    const int64_t s1 = std::min(s_end, s0 + slice.slice_rows()), len = s1 - s0;
    const bool first = s0 == s_begin;
    slice.begin(s1);
    group_scores(qt, kw, kv, slice, len, sc);
    slice_softmax(sc, len, kw, nh, scale, first, m, l, out, out_ld, lat);
    pv_slice(sc, kw, nh, slice.latent(), len, lat, first, out, out_ld);
  }
}

}  // namespace

void kv_row_to_bf16(const float* src, int64_t count, uint16_t* dst) {
#if defined(__AVX512BF16__)
  to_bf16(src, count, dst);
#else
  (void)src, (void)count, (void)dst;
  XDS_CHECK(false, "kv_row_to_bf16: this build has no AVX512_BF16");
#endif
}

bool absorbed_bf16_available() {
#if defined(__AVX512BF16__)
  return panel_isa() == PanelIsa::kAvx512;
#else
  return false;
#endif
}

void mla_absorbed_attention(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                            const LatentKvView& kv, int64_t ctx, float scale,
                            const AbsorbedNextRows* next) {
  if (ctx <= 0) return;
  // The whole context as one part, written straight to q.out, then normalised.
  const int64_t nh = head_end - head_begin;
  thread_local std::vector<float> ml;  // [2, nh]: m, l
  ml.resize(static_cast<size_t>(2 * nh));
  float* out = q.out + head_begin * q.out_ld;
  mla_absorbed_attention_part(q, head_begin, head_end, kv, 0, ctx, scale,
                              {out, q.out_ld, ml.data(), ml.data() + nh}, next);
  for (int64_t j = 0; j < nh; ++j) {
    const float inv = 1.0f / ml[static_cast<size_t>(nh + j)];
    for (int64_t c = 0; c < kv.latent_dim; ++c) out[j * q.out_ld + c] *= inv;
  }
}

void mla_absorbed_attention_part(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                                 const LatentKvView& kv, int64_t s_begin, int64_t s_end,
                                 float scale, const AbsorbedPart& part,
                                 const AbsorbedNextRows* next) {
  XDS_CHECK(s_begin < s_end, "mla_absorbed_attention_part: empty rows [{}, {})", s_begin, s_end);
  thread_local std::vector<float> qt;
  qt.resize(static_cast<size_t>((kv.latent_dim + kv.rope_dim) * 16));
  for (int64_t g = head_begin; g < head_end; g += 16) {
    const int64_t j = g - head_begin;
    // Only the last group hands over to the next call (the others' rows come again).
    attend_group(q, g, std::min<int64_t>(16, head_end - g), kv, s_begin, s_end, scale, qt.data(),
                 part.out + j * part.out_ld, part.out_ld, part.m + j, part.l + j,
                 g + 16 >= head_end ? next : nullptr);
  }
}

void mla_absorbed_merge(std::span<const AbsorbedPart> parts, int64_t nh, int64_t lat, float* out,
                        int64_t out_ld) {
  for (int64_t h = 0; h < nh; ++h) {
    float mx = -std::numeric_limits<float>::infinity();
    for (const AbsorbedPart& p : parts) mx = std::max(mx, p.m[h]);
    float denom = 0.0f;
    for (const AbsorbedPart& p : parts) denom += std::exp(p.m[h] - mx) * p.l[h];
    const float inv = 1.0f / denom;
    float* o = out + h * out_ld;
    for (size_t i = 0; i < parts.size(); ++i) {
      const float w = std::exp(parts[i].m[h] - mx) * inv;
      const float* src = parts[i].out + h * parts[i].out_ld;
      if (i == 0) {
        for (int64_t c = 0; c < lat; ++c) o[c] = w * src[c];
      } else {
        for (int64_t c = 0; c < lat; ++c) o[c] += w * src[c];
      }
    }
  }
}

AbsorbedSplit absorbed_context_split(int64_t ctx) {
  const int64_t count = std::clamp<int64_t>(ctx / kAbsorbedPartMinRows, 1, kAbsorbedMaxParts);
  return {count, (ctx + count - 1) / count};
}

}  // namespace xds::kernels

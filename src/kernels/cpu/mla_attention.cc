// The absorbed attention's fp32 products (scores tiles, softmax step, p·latent tiles) and
// its entry points; the bf16 products are in mla_attention_bf16.cc.
#include "kernels/cpu/mla_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/mla_absorbed_group.h"
#include "kernels/cpu/mla_slice_rows.h"
#include "kernels/cpu/simd_ops.h"
#include "kernels/cpu/static_dispatch.h"
#include "kernels/cpu/transpose16.h"
#include "kernels/cpu/vec_math.h"

namespace xds::kernels {

namespace {

using absorbed_detail::AbsorbedGroup;
using absorbed_detail::slice_softmax;
using absorbed_detail::SliceRows;
using absorbed_detail::transpose_queries;

// Scores of R cached rows × NV·L heads (L = Ops::kLanes: 8 with AVX2, 16 with AVX-512)
// over the `cols` columns of one plane (latent or rope), vectorised over heads:
//   part[r][v] (+)= Σ_{c < cols} qt[c][v] · rows[r][c]
// qt: the plane's transposed queries [cols][NV · L]; part: [R][NV · L], loaded unless
// `first`. One broadcast and NV fused multiply-adds per row and column, in ascending c:
// whatever Ops or R, every score is one FMA per column in the same order (the latent
// plane, then the rope plane), so the same bits.
// Every 16 columns it prefetches one line of each of the R rows at `next` (the tile that
// runs after this one): the cached rows come from DRAM, and hardware prefetch alone leaves
// the kernel well short of its speed (docs/benchmarks.md, "Absorbed MLA attention").
template <class Ops, int NV, int R>
void scores_tile(const float* qt, const float* const* rows, const float* const* next, int64_t cols,
                 bool first, float* part) {
  static_assert(NV == 1 || NV == 2);
  using V = typename Ops::V;
  constexpr int kW = NV * Ops::kLanes;
  // One-dimensional accumulator arrays (heads 0-7 in a0, 8-15 in a1 with AVX2), every loop
  // over r unrolled: GCC then keeps them in registers. With acc[R][NV] it stores all of
  // them to the stack on every c (one store per FMA pair, a fraction of the peak).
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

}  // namespace

void absorbed_detail::transpose_queries(const AbsorbedQuery& q, int64_t h0, int64_t nh, int64_t lat,
                                        int64_t dr, int64_t kw, float* qt) {
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

namespace {

// Scores of a slice's len rows (at most kAbsorbedSliceRows; its latent and rope row
// pointers) into part [len][NV · L]: the latent plane, then the rope plane, each in tiles of
// R rows (the rest, < R, in one tile). A tile prefetches the next one's rows; the last tile
// of each plane the first rows of that plane after the slice (the slice's next rows: ahead()
// of them; none: its own last row again).
// Whole latent rows per tile: column blocks of 64 (the queries' block staying in L1) run
// faster from L2 but slower from DRAM, where batch 64 reads them (docs/benchmarks.md).
template <class Ops, int NV, int R>
void slice_scores(const float* qt, const SliceRows<float>& slice, int64_t len, int64_t lat,
                  int64_t dr, float* part) {
  constexpr int kW = NV * Ops::kLanes;
  const float* const* latent = slice.latent();
  const float* const* rope = slice.rope();
  const float* const* after_latent = slice.next_latent();
  const float* const* after_rope = slice.next_rope();
  const int64_t ahead = slice.ahead();
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
void strided_slice_scores(const float* qt, const SliceRows<float>& slice, int64_t len,
                          float* part) {
  const float* const* latent = slice.latent();
  const float* const* rope = slice.rope();
  const float* const* after_latent = slice.next_latent();
  const float* const* after_rope = slice.next_rope();
  const int64_t ahead = slice.ahead();
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
// accumulators per tile: with 8 (AVX2, R = 4) the FMA chains leave the kernel far from its
// peak (docs/benchmarks.md). AVX-512 holds 16 heads in one register.
void group_scores(const float* qt, int64_t kw, const LatentKvView& kv,
                  const SliceRows<float>& slice, int64_t len, float* sc) {
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
#if defined(__AVX512F__)
  if (kw == 16 && panel_isa() == PanelIsa::kAvx512) {
    if (strided_shape(kv)) return strided_slice_scores(qt, slice, len, sc);
    return slice_scores<Avx512Ops, 1, 12>(qt, slice, len, lat, dr, sc);
  }
#endif
  if (kw == 16) return slice_scores<Avx2Ops, 2, 6>(qt, slice, len, lat, dr, sc);
  slice_scores<Avx2Ops, 1, 12>(qt, slice, len, lat, dr, sc);
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
  // At C = 512 (480 + 32) 48 columns run faster than 32 from L2, and 16 × 16 (one load, 16
  // broadcasts) slower than 32 × 8 (docs/benchmarks.md, "Absorbed MLA attention").
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

}  // namespace

// Eight heads at a time with exp_avx2, or 16 with exp_avx512 where the AVX-512 kernels run
// and the scores are 16 wide: the same steps per lane, so the same bits.
void absorbed_detail::slice_softmax(const AbsorbedGroup& g, float* sc, int64_t len, int64_t kw,
                                    bool first) {
  const int64_t nh = g.nh, out_ld = g.out_ld, lat = g.kv.latent_dim;
  const float scale = g.scale;
  float* m = g.m;
  float* l = g.l;
  float* out = g.out;
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

namespace {

// The group (AbsorbedGroup) in slices of kAbsorbedSliceRows rows; per slice the scores (the
// rows come from DRAM, prefetched), an online softmax (running max m and sum l per head; out
// rescaled by exp(m_old - m_new) when the max grows), then p·latent while the slice's rows
// are still in L2. Each cached row is read from memory once.
void attend_group(const AbsorbedGroup& g) {
  const AbsorbedQuery& q = g.q;
  const LatentKvView& kv = g.kv;
  if (q.bf16 && absorbed_bf16_available()) return absorbed_detail::attend_group_bf16(g);
  XDS_CHECK(!kv.bf16(),
            "absorbed attention: bf16 KV planes are read only by the bf16 products "
            "(AVX512_BF16 and the AVX-512 panel ISA)");
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  const int64_t nh = g.nh, kw = nh > 8 ? 16 : 8;
  float* qt = g.qt;
  transpose_queries(q, g.h0, nh, lat, dr, kw, qt);
  alignas(64) float sc[kAbsorbedSliceRows * 16];  // the slice's scores, then p: [len][kw]
  // Each scores tile prefetches the next tile's rows; the last one the first rows of the
  // next slice (of the thread's next call after the last slice). Prefetching a whole slice
  // ahead, spread over the scores and p·latent as the bf16 products do, is slower cold here
  // (bench_attention; docs/benchmarks.md, "Absorbed MLA attention").
  SliceRows<float> slice(kv, kv.latent, kv.rope, g.s_begin, g.s_end, g.next);
  for (int64_t s0 = g.s_begin; s0 < g.s_end; s0 += slice.slice_rows(), slice.advance()) {
    const int64_t s1 = std::min(g.s_end, s0 + slice.slice_rows()), len = s1 - s0;
    const bool first = s0 == g.s_begin;
    slice.begin(s1);
    group_scores(qt, kw, kv, slice, len, sc);
    slice_softmax(g, sc, len, kw, first);
    pv_slice(sc, kw, nh, slice.latent(), len, lat, first, g.out, g.out_ld);
  }
}

}  // namespace

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
  // An INT8 latent: the bf16 products read its rows directly (mla_attention_bf16.cc); the
  // fp32 ones through dequantized chunks (mla_attention_int8.cc).
  if (kv.int8() && !(q.bf16 && absorbed_bf16_available())) {
    return absorbed_detail::attend_int8_part(q, head_begin, head_end, kv, s_begin, s_end, scale,
                                             part);
  }
  thread_local std::vector<float> qt;
  qt.resize(static_cast<size_t>((kv.latent_dim + kv.rope_dim) * 16));
  for (int64_t g = head_begin; g < head_end; g += 16) {
    const int64_t j = g - head_begin;
    // Only the last group hands over to the next call (the others' rows come again).
    attend_group({q, g, std::min<int64_t>(16, head_end - g), kv, s_begin, s_end, scale, qt.data(),
                  part.out + j * part.out_ld, part.out_ld, part.m + j, part.l + j,
                  g + 16 >= head_end ? next : nullptr});
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

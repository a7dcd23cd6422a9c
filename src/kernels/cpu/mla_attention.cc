#include "kernels/cpu/mla_attention.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd_ops.h"
#include "kernels/cpu/static_dispatch.h"

namespace xds::kernels {

namespace {

// scores for R cached rows × NV·L heads at once (L = Ops::kLanes: 8 with AVX2, 16 with
// AVX-512), vectorised over heads:
//   acc[r][v] = Σ_c qt[c][Lv .. Lv+L) · latent(s0+r)[c]  +  Σ_c qt[C + c][..] · rope(s0+r)[c]
// qt: [C + Dr][NV * L] (the heads' absorbed queries transposed, zero-padded), so every
// product is one broadcast and NV fused multiply-adds; no horizontal sums. Every score is
// one FMA per column in the same order (latent, then rope, ascending) whatever Ops, NV or
// R: the same bits.
// Stores sc[h * ld + r] for h < nh. While it runs, the rows of the next tile (s0 + R ..
// s0 + 2R, clamped to `last`; latent and rope) are prefetched one line per 16 columns: the
// cached rows come from DRAM, and hardware prefetch alone left the kernel at ~60 % of its
// in-cache speed.
template <class Ops, int NV, int R>
void scores_rows(const float* qt, const LatentKvView& kv, int64_t s0, int64_t last, int64_t nh,
                 float* sc, int64_t ld) {
  static_assert(NV == 1 || NV == 2);
  using V = typename Ops::V;
  constexpr int kW = NV * Ops::kLanes;
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  // One-dimensional accumulator arrays (heads 0-7 in a0, 8-15 in a1 with AVX2), every loop
  // over r unrolled: GCC then keeps them in registers. With acc[R][NV] it also stored all of
  // them to the stack on every c (one store per FMA pair; the kernel ran at ~30 % of peak).
  V a0[R], a1[R];
  const float* lrow[R];
  const float* rrow[R];
  const float* lnext[R];
  const float* rnext[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    a0[r] = Ops::zero();
    a1[r] = Ops::zero();
    lrow[r] = kv.latent_at(s0 + r);
    rrow[r] = kv.rope_at(s0 + r);
    lnext[r] = kv.latent_at(std::min(last, s0 + R + r));
    rnext[r] = kv.rope_at(std::min(last, s0 + R + r));
  }
  auto accumulate = [&](const float* q, const float* const* rows, int64_t c)
      __attribute__((always_inline)) {
    const V q0 = Ops::load(q);
    V q1 = q0;
    if constexpr (NV == 2) q1 = Ops::load(q + Ops::kLanes);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const V b = Ops::set1(rows[r][c]);
      a0[r] = Ops::fma(b, q0, a0[r]);
      if constexpr (NV == 2) a1[r] = Ops::fma(b, q1, a1[r]);
    }
  };
  // The rope rows (another plane) are prefetched too, one line of each per 16 columns
  // between the latent ones: left to demand misses they cost 4 % of the scores' time.
  const int64_t rope_lines_end = 16 * ((dr + 15) / 16);
  // 16 columns (one line of each row) per outer step: the prefetches go there, and the
  // inner loop needs only the row pointers, which GCC then keeps in registers (with the
  // prefetch test inside it reloaded them from the stack for every broadcast).
  const int64_t lat16 = lat / 16 * 16;
  for (int64_t c0 = 0; c0 < lat16; c0 += 16) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(lnext[r] + c0), _MM_HINT_T0);
    if (c0 < rope_lines_end) {
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(rnext[r] + c0), _MM_HINT_T0);
    }
    const float* l[R];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) l[r] = lrow[r];
    for (int64_t c = c0; c < c0 + 16; ++c) accumulate(qt + c * kW, l, c);
  }
  for (int64_t c = lat16; c < lat; ++c) accumulate(qt + c * kW, lrow, c);
  for (int64_t c = 0; c < dr; ++c) accumulate(qt + (lat + c) * kW, rrow, c);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    alignas(64) float lanes[kW];
    Ops::store(lanes, a0[r]);
    if constexpr (NV == 2) Ops::store(lanes + Ops::kLanes, a1[r]);
    for (int64_t h = 0; h < std::min<int64_t>(nh, kW); ++h) sc[h * ld + r] = lanes[h];
  }
}

// qt[c][j] = the absorbed query of head h0 + j at column c (latent, then rope), zero for
// j >= nh: [C + Dr, kW].
void transpose_queries(const AbsorbedQuery& q, int64_t h0, int64_t nh, int64_t lat, int64_t dr,
                       int64_t kw, float* qt) {
  for (int64_t c = 0; c < lat + dr; ++c) {
    for (int64_t j = 0; j < kw; ++j) {
      qt[c * kw + j] = j >= nh    ? 0.0f
                       : c < lat ? q.q_abs[(h0 + j) * q.q_abs_ld + c]
                                 : q.q_pe[(h0 + j) * q.q_pe_ld + (c - lat)];
    }
  }
}

// Scores of nh <= NV * Ops::kLanes heads over rows [s0, s1) into sc[h * ld + (s - s0)]:
// tiles of R rows, the rest (< R) in one tile.
template <class Ops, int NV, int R>
void slice_scores(const float* qt, int64_t nh, const LatentKvView& kv, int64_t s0, int64_t s1,
                  int64_t last, float* sc, int64_t ld) {
  int64_t s = s0;
  for (; s + R <= s1; s += R) scores_rows<Ops, NV, R>(qt, kv, s, last, nh, sc + (s - s0), ld);
  if (s < s1) {
    dispatch_1_to<R - 1>(static_cast<int>(s1 - s), [&]<int Rest>() {
      scores_rows<Ops, NV, Rest>(qt, kv, s, last, nh, sc + (s - s0), ld);
    });
  }
}

// The scores of a group of nh heads whose transposed queries are kw (8 or 16) wide. 12
// accumulators per tile: with 8 (AVX2, R = 4) the FMA chains left the kernel at ~55 % of
// peak. AVX-512 holds 16 heads in one register.
void group_scores(const float* qt, int64_t kw, int64_t nh, const LatentKvView& kv, int64_t s0,
                  int64_t s1, int64_t last, float* sc, int64_t ld) {
#if defined(__AVX512F__)
  if (kw == 16 && panel_isa() == PanelIsa::kAvx512)
    return slice_scores<Avx512Ops, 1, 12>(qt, nh, kv, s0, s1, last, sc, ld);
#endif
  if (kw == 16) return slice_scores<Avx2Ops, 2, 6>(qt, nh, kv, s0, s1, last, sc, ld);
  slice_scores<Avx2Ops, 1, 12>(qt, nh, kv, s0, s1, last, sc, ld);
}

// out[h][c0 .. c0+2L) (+)= Σ_{s in [s0, s1)} p[h][s] · latent(s)[c0 .. c0+2L) for H heads
// (L = Ops::kLanes): 2H accumulators, per s two loads of the latent row and H broadcasts of
// p. Sums run in ascending s with one FMA each, starting from out (or from zero when
// `first`), whatever Ops: the same bits.
template <class Ops, int H>
void pv_tile(const float* p, int64_t ldp, const float* const* rows, int64_t s0, int64_t s1,
             int64_t c0, bool first, float* out, int64_t ldo) {
  using V = typename Ops::V;
  constexpr int kL = Ops::kLanes;
  V a0[H], a1[H];
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    a0[h] = first ? Ops::zero() : Ops::load(out + h * ldo + c0);
    a1[h] = first ? Ops::zero() : Ops::load(out + h * ldo + c0 + kL);
  }
  for (int64_t s = s0; s < s1; ++s) {
    const float* row = rows[s - s0] + c0;
    const V l0 = Ops::load(row);
    const V l1 = Ops::load(row + kL);
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const V w = Ops::set1(p[h * ldp + s]);
      a0[h] = Ops::fma(w, l0, a0[h]);
      a1[h] = Ops::fma(w, l1, a1[h]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    Ops::store(out + h * ldo + c0, a0[h]);
    Ops::store(out + h * ldo + c0 + kL, a1[h]);
  }
}

// Columns [c_begin, c_end) (a multiple of 2L) of p·latent in pv_tile<Ops> tiles: nh heads
// in tiles of at most MaxH, as even as possible (16 heads as 6 + 5 + 5 or 8 + 8).
template <class Ops, int MaxH>
void pv_columns(const float* p, int64_t nh, int64_t ldp, const float* const* rows, int64_t s0,
                int64_t s1, int64_t c_begin, int64_t c_end, bool first, float* out, int64_t ldo) {
  for (int64_t c0 = c_begin; c0 < c_end; c0 += 2 * Ops::kLanes) {
    for (int64_t h0 = 0; h0 < nh;) {
      const int64_t left = nh - h0, tiles = (left + MaxH - 1) / MaxH;
      const int h = static_cast<int>((left + tiles - 1) / tiles);
      dispatch_1_to<MaxH>(h, [&]<int H>() {
        pv_tile<Ops, H>(p + h0 * ldp - s0, ldp, rows, s0, s1, c0, first, out + h0 * ldo, ldo);
      });
      h0 += h;
    }
  }
}

// out[h] (+)= Σ_{s in [s0, s1)} p[h][s - s0] · latent(s) for nh heads: [nh, len]·[len, C]
// (`first`: out starts from zero). 16-column tiles of up to 6 heads; every output is summed
// in ascending s with one FMA per position, whatever the tiling.
void pv_slice(const float* p, int64_t nh, int64_t ldp, const LatentKvView& kv, int64_t s0,
              int64_t s1, bool first, float* out, int64_t ldo) {
  const int64_t lat = kv.latent_dim, lat16 = lat / 16 * 16;
  XDS_CHECK(s1 - s0 <= kAbsorbedSliceRows, "pv_slice: {} rows", s1 - s0);
  const float* rows[kAbsorbedSliceRows];
  for (int64_t s = s0; s < s1; ++s) rows[s - s0] = kv.latent_at(s);
  // Columns past the last multiple of 16 (none at C = 512; small test models), one by one.
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t c = lat16; c < lat; ++c) {
      float acc = first ? 0.0f : out[h * ldo + c];
      for (int64_t s = s0; s < s1; ++s) acc = std::fma(p[h * ldp + s - s0], rows[s - s0][c], acc);
      out[h * ldo + c] = acc;
    }
  }
  int64_t c_begin = 0;
#if defined(__AVX512F__)
  if (panel_isa() == PanelIsa::kAvx512) {  // 32 columns × up to 8 heads (18 of 32 registers)
    c_begin = lat / 32 * 32;
    pv_columns<Avx512Ops, 8>(p, nh, ldp, rows, s0, s1, 0, c_begin, first, out, ldo);
  }
#endif
  // 16 columns × up to 6 heads (14 of 16 registers)
  pv_columns<Avx2Ops, 6>(p, nh, ldp, rows, s0, s1, c_begin, lat16, first, out, ldo);
}

// One group of nh <= 16 heads over context rows [s_begin, s_end), in slices of
// kAbsorbedSliceRows rows; per slice the scores (the rows come from DRAM, prefetched), an
// online softmax (running max m and sum l per head; out rescaled by exp(m_old - m_new) when
// the max grows), then p·latent while the slice's rows are still in L2. Each cached row is
// read from memory once. Leaves out unnormalised: out[h] = Σ_s e^(score - m[h]) latent(s),
// l[h] = Σ_s e^(score - m[h]).
void attend_group(const AbsorbedQuery& q, int64_t h0, int64_t nh, const LatentKvView& kv,
                  int64_t s_begin, int64_t s_end, float scale, float* sc, float* qt, float* out,
                  int64_t out_ld, float* m, float* l) {
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  const int64_t kw = nh > 8 ? 16 : 8;
  transpose_queries(q, h0, nh, lat, dr, kw, qt);
  // Slices of equal length (at most kAbsorbedSliceRows): 257 rows go as 86 + 86 + 85, not
  // 128 + 128 + 1.
  const int64_t slices = (s_end - s_begin + kAbsorbedSliceRows - 1) / kAbsorbedSliceRows;
  const int64_t slice_rows = (s_end - s_begin + slices - 1) / slices;
  for (int64_t s0 = s_begin; s0 < s_end; s0 += slice_rows) {
    const int64_t s1 = std::min(s_end, s0 + slice_rows), len = s1 - s0;
    const bool first = s0 == s_begin;
    group_scores(qt, kw, nh, kv, s0, s1, s_end - 1, sc, len);
    for (int64_t j = 0; j < nh; ++j) {
      float* row = sc + j * len;
      const float mx = scale_and_max(row, len, scale);
      const float m_new = first ? mx : std::max(m[j], mx);
      const float sum = exp_shifted_sum(row, len, m_new);
      if (first) {
        l[j] = sum;
      } else {
        const float alpha = std::exp(m[j] - m_new);
        l[j] = l[j] * alpha + sum;
        float* o = out + j * out_ld;
        for (int64_t c = 0; c < lat; ++c) o[c] *= alpha;
      }
      m[j] = m_new;
    }
    pv_slice(sc, nh, len, kv, s0, s1, first, out, out_ld);
  }
}

}  // namespace

void mla_absorbed_attention(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                            const LatentKvView& kv, int64_t ctx, float scale, float* scores) {
  if (ctx <= 0) return;
  // The whole context as one part, written straight to q.out, then normalised.
  const int64_t nh = head_end - head_begin;
  thread_local std::vector<float> ml;  // [2, nh]: m, l
  ml.resize(static_cast<size_t>(2 * nh));
  float* out = q.out + head_begin * q.out_ld;
  mla_absorbed_attention_part(q, head_begin, head_end, kv, 0, ctx, scale, scores,
                              {out, q.out_ld, ml.data(), ml.data() + nh});
  for (int64_t j = 0; j < nh; ++j) {
    const float inv = 1.0f / ml[static_cast<size_t>(nh + j)];
    for (int64_t c = 0; c < kv.latent_dim; ++c) out[j * q.out_ld + c] *= inv;
  }
}

void mla_absorbed_attention_part(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                                 const LatentKvView& kv, int64_t s_begin, int64_t s_end,
                                 float scale, float* scores, const AbsorbedPart& part) {
  XDS_CHECK(s_begin < s_end, "mla_absorbed_attention_part: empty rows [{}, {})", s_begin, s_end);
  thread_local std::vector<float> qt;
  qt.resize(static_cast<size_t>((kv.latent_dim + kv.rope_dim) * 16));
  for (int64_t g = head_begin; g < head_end; g += 16) {
    const int64_t j = g - head_begin;
    attend_group(q, g, std::min<int64_t>(16, head_end - g), kv, s_begin, s_end, scale, scores,
                 qt.data(), part.out + j * part.out_ld, part.out_ld, part.m + j, part.l + j);
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

void mla_expanded_attention(const ExpandedChunk& c, int64_t h, float scale, float* scores) {
  use_single_threaded_blas();
  const int64_t dq = c.dn + c.dr, dkv = c.dn + c.dv;
  const float* k_nope = c.kv + h * dkv;
  const float* v = k_nope + c.dn;
  for (int64_t t0 = 0; t0 < c.m; t0 += kExpandedRowBlock) {
    const int64_t rows = std::min(kExpandedRowBlock, c.m - t0);
    const int64_t ctx = c.p0 + t0 + rows;  // the block's last query sees [0, ctx)
    const float* q = c.q + t0 * c.q_ld + h * dq;
    const int ir = static_cast<int>(rows), ic = static_cast<int>(ctx);
    // scores[rows, ctx] = q_nope · k_nopeᵀ + q_pe · k_peᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ic, static_cast<int>(c.dn), 1.0f, q,
                static_cast<int>(c.q_ld), k_nope, static_cast<int>(c.kv_ld), 0.0f, scores, ic);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ic, static_cast<int>(c.dr), 1.0f,
                q + c.dn, static_cast<int>(c.q_ld), c.rope, static_cast<int>(c.dr), 1.0f, scores, ic);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = scores + i * ctx;
      const int64_t visible = c.p0 + t0 + i + 1;
      for (int64_t s = 0; s < visible; ++s) row[s] *= scale;
      softmax_inplace(row, visible);
      std::fill(row + visible, row + ctx, 0.0f);
    }
    // out[rows, Dv] = p · v
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ir, static_cast<int>(c.dv), ic, 1.0f,
                scores, ic, v, static_cast<int>(c.kv_ld), 0.0f, c.out + t0 * c.out_ld + h * c.dv,
                static_cast<int>(c.out_ld));
  }
}

}  // namespace xds::kernels

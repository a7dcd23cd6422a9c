// The expanded MLA attention of a prefill chunk (mla_attention.h, mla_expanded_attention):
// OpenBLAS sgemm per block of queries with AVX2, an own tiled kernel with AVX-512.
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/static_dispatch.h"
#include "kernels/cpu/transpose16.h"
#include "kernels/cpu/vec_math.h"

namespace xds::kernels {
namespace {

// Three single-threaded sgemm products per block of kExpandedRowBlock queries (scores =
// q_nope·k_nopeᵀ + q_pe·k_peᵀ, scaled, causal softmax, out = p·v).
// scratch: kExpandedRowBlock * (p0 + m) floats.
void expanded_sgemm(const ExpandedChunk& c, int64_t h, float scale, float* scores) {
  use_single_threaded_blas();
  const int64_t dq = c.dn + c.dr, dkv = c.dn + c.dv;
  const float* k_nope = c.kv + h * dkv;
  const float* v = k_nope + c.dn;
  for (int64_t t0 = 0; t0 < c.m; t0 += kExpandedRowBlock) {
    const int64_t rows = std::min(kExpandedRowBlock, c.m - t0);
    const int64_t ctx = c.p0 + t0 + rows;  // the block's last query sees [0, ctx)
    const float* q = c.q + t0 * c.q_ld + h * dq;
    const int ir = static_cast<int>(rows), ic = static_cast<int>(ctx);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ic, static_cast<int>(c.dn), 1.0f, q,
                static_cast<int>(c.q_ld), k_nope, static_cast<int>(c.kv_ld), 0.0f, scores, ic);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ic, static_cast<int>(c.dr), 1.0f,
                q + c.dn, static_cast<int>(c.q_ld), c.rope, static_cast<int>(c.dr), 1.0f, scores,
                ic);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = scores + i * ctx;
      const int64_t visible = c.p0 + t0 + i + 1;
      for (int64_t s = 0; s < visible; ++s) row[s] *= scale;
      softmax_inplace(row, visible);
      std::fill(row + visible, row + ctx, 0.0f);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ir, static_cast<int>(c.dv), ic, 1.0f,
                scores, ic, v, static_cast<int>(c.kv_ld), 0.0f, c.out + t0 * c.out_ld + h * c.dv,
                static_cast<int>(c.out_ld));
  }
}

#if defined(__AVX512F__)
// The AVX-512 kernel works on tiles of 16 queries, one per lane, so that the scores, the
// softmax and the probabilities of a tile all lie [key][query] and need no transposition;
// only its inputs are transposed, once per head, 16 × 16 blocks in registers:
//
//   qt: the head's queries, [m / 16][Dn + Dr][16] (query 16i + q of tile i in lane q;
//       queries past the chunk zero);
//   kt: the head's keys, [ctx / 16][Dn + Dr][16] (k_nope columns, then the rope plane; keys
//       past the context zero);
//   vp: the head's values, [ctx][Dv] (in kv a value row lies a whole row of all heads from
//       the next, 16 KB at 16 heads: p·v read them through one L1 set and a new page each);
//   st: scores, then probabilities, [keys][16].
//
// scores: 16 accumulators (keys) of 16 queries, per column one load of qt and 16 FMAs with
// the keys broadcast from one line of kt; p·v: 16 accumulators (queries) of 16 value
// columns, per key one load of the value row and 16 FMAs with the probabilities broadcast
// from one line of st. Every score is Σ_c in ascending c (nope, then rope) and every output
// Σ_s in ascending s, one FMA each, whatever the tiling or the chunking: a query's result
// does not depend on the chunk it came in.
constexpr int kTile = 16;  // queries per tile, keys per tile, columns per transposed block

int64_t tiles_of(int64_t n) {
  return (n + kTile - 1) / kTile;
}

// st[16j + k][q] = Σ_c qt[c][q] · kt_j[c][k] for the key tiles [0, tiles).
void tile_scores(const float* qt, const float* kt, int64_t dq, int64_t tiles, float* st) {
  for (int64_t j = 0; j < tiles; ++j) {
    const float* kj = kt + j * dq * kTile;
    __m512 a[kTile];
#pragma GCC unroll 16
    for (int k = 0; k < kTile; ++k) a[k] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t col = 0; col < dq; ++col) {
      const __m512 q = _mm512_loadu_ps(qt + col * kTile);
      const float* kc = kj + col * kTile;
#pragma GCC unroll 16
      for (int k = 0; k < kTile; ++k) a[k] = _mm512_fmadd_ps(_mm512_set1_ps(kc[k]), q, a[k]);
    }
#pragma GCC unroll 16
    for (int k = 0; k < kTile; ++k) _mm512_storeu_ps(st + (j * kTile + k) * kTile, a[k]);
  }
}

// Lane q's causal softmax over the keys s < keys, key s visible to lane q when s <=
// first_pos + q: st = e^(scale·score - max) (0 for the keys it does not see); returns
// 1 / Σ e per lane.
__m512 tile_softmax(float* st, int64_t keys, int64_t first_pos, float scale) {
  const __m512i pos =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first_pos)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  auto seen = [&](int64_t s) {  // lanes that see key s
    return _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(static_cast<int>(s)));
  };
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t s = 0; s < keys; ++s) {
    float* v = st + s * kTile;
    const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(v), vs);
    _mm512_storeu_ps(v, x);
    mx = _mm512_mask_max_ps(mx, seen(s), mx, x);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int64_t s = 0; s < keys; ++s) {
    float* v = st + s * kTile;
    const __m512 e =
        _mm512_maskz_mov_ps(seen(s), exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(v), mx)));
    _mm512_storeu_ps(v, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_div_ps(_mm512_set1_ps(1.0f), sum);
}

// out[q][d0 .. d0 + 16) = inv[q] · Σ_{s < keys} st[s][q] · vp[s][d0 ..] for the Q queries
// of the tile (the last group of value columns masked when Dv is not a multiple of 16).
template <int Q>
void tile_pv(const float* st, int64_t keys, const float* vp, int64_t dv, __m512 inv, float* out,
             int64_t out_ld) {
  alignas(64) float inv_lanes[kTile];
  _mm512_store_ps(inv_lanes, inv);
  for (int64_t d0 = 0; d0 < dv; d0 += 16) {
    const __mmask16 cols = static_cast<__mmask16>(dv - d0 >= 16 ? 0xffff : (1u << (dv - d0)) - 1);
    __m512 a[Q];
#pragma GCC unroll 16
    for (int q = 0; q < Q; ++q) a[q] = _mm512_setzero_ps();
    for (int64_t s = 0; s < keys; ++s) {
      const __m512 v = _mm512_maskz_loadu_ps(cols, vp + s * dv + d0);
      const float* p = st + s * kTile;
#pragma GCC unroll 16
      for (int q = 0; q < Q; ++q) a[q] = _mm512_fmadd_ps(_mm512_set1_ps(p[q]), v, a[q]);
    }
#pragma GCC unroll 16
    for (int q = 0; q < Q; ++q)
      _mm512_mask_storeu_ps(out + q * out_ld + d0, cols,
                            _mm512_mul_ps(a[q], _mm512_set1_ps(inv_lanes[q])));
  }
}

// Offsets (in floats) of the kernel's buffers in the caller's scratch, and their total.
struct ScratchLayout {
  int64_t qt, kt, vp, st, total;
  ScratchLayout(int64_t dq, int64_t dv, int64_t m, int64_t ctx) {
    qt = 0;                                // [tiles(m)][dq][16]
    kt = qt + tiles_of(m) * kTile * dq;    // [tiles(ctx)][dq][16]
    vp = kt + tiles_of(ctx) * kTile * dq;  // [ctx][dv]
    st = vp + ctx * dv;                    // [tiles(ctx) · 16][16]
    total = st + tiles_of(ctx) * kTile * kTile;
  }
};

void expanded_avx512(const ExpandedChunk& c, int64_t h, float scale, float* scratch) {
  const int64_t dq = c.dn + c.dr, ctx = c.p0 + c.m;
  const ScratchLayout at(dq, c.dv, c.m, ctx);
  float *qt = scratch + at.qt, *kt = scratch + at.kt, *vp = scratch + at.vp, *st = scratch + at.st;
  const float* k_nope = c.kv + h * (c.dn + c.dv);
  transpose_row_tiles(c.q + h * dq, c.q_ld, c.m, dq, 0, qt, dq * kTile);
  transpose_row_tiles(k_nope, c.kv_ld, ctx, c.dn, 0, kt, dq * kTile);
  transpose_row_tiles(c.rope, c.dr, ctx, c.dr, c.dn, kt, dq * kTile);
  for (int64_t s = 0; s < ctx; ++s)
    std::memcpy(vp + s * c.dv, k_nope + s * c.kv_ld + c.dn, sizeof(float) * c.dv);
  for (int64_t t0 = 0; t0 < c.m; t0 += kTile) {
    const int qn = static_cast<int>(std::min<int64_t>(kTile, c.m - t0));
    const int64_t keys = c.p0 + t0 + qn;  // the tile's last query sees [0, keys)
    tile_scores(qt + t0 * dq, kt, dq, tiles_of(keys), st);
    const __m512 inv = tile_softmax(st, keys, c.p0 + t0, scale);
    float* out = c.out + t0 * c.out_ld + h * c.dv;
    dispatch_1_to<kTile>(qn, [&]<int Q>() { tile_pv<Q>(st, keys, vp, c.dv, inv, out, c.out_ld); });
  }
}
#endif

}  // namespace

int64_t expanded_scratch_floats(int64_t dn, int64_t dr, int64_t dv, int64_t m, int64_t ctx) {
  int64_t floats = kExpandedRowBlock * ctx;  // the sgemm form's scores
#if defined(__AVX512F__)
  floats = std::max(floats, ScratchLayout(dn + dr, dv, m, ctx).total);
#endif
  return floats;
}

void mla_expanded_attention(const ExpandedChunk& c, int64_t h, float scale, float* scratch) {
#if defined(__AVX512F__)
  if (panel_isa() == PanelIsa::kAvx512) return expanded_avx512(c, h, scale, scratch);
#endif
  expanded_sgemm(c, h, scale, scratch);
}

}  // namespace xds::kernels

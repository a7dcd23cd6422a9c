#include "kernels/cpu/mla_attention.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"

namespace xds::kernels {

namespace {

// scores for R cached rows × NV·8 heads at once, vectorised over heads:
//   acc[r][v] = Σ_c qt[c][8v .. 8v+8) · latent(s0+r)[c]  +  Σ_c qt[C + c][..] · rope(s0+r)[c]
// qt: [C + Dr][NV * 8] (the heads' absorbed queries transposed, zero-padded), so every
// product is one broadcast and NV fused multiply-adds; no horizontal sums.
// Stores sc[h * ld + r] for h < nh.
template <int NV, int R>
void scores_rows(const float* qt, const LatentKvView& kv, int64_t s0, int64_t nh, float* sc,
                 int64_t ld) {
  constexpr int kW = NV * 8;
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  const float* lrow[R];
  const float* rrow[R];
  for (int r = 0; r < R; ++r) lrow[r] = kv.latent_at(s0 + r), rrow[r] = kv.rope_at(s0 + r);
  for (int64_t c = 0; c < lat; ++c) {
    __m256 qv[NV];
    for (int v = 0; v < NV; ++v) qv[v] = _mm256_loadu_ps(qt + c * kW + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 l = _mm256_broadcast_ss(lrow[r] + c);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(l, qv[v], acc[r][v]);
    }
  }
  for (int64_t c = 0; c < dr; ++c) {
    __m256 qv[NV];
    for (int v = 0; v < NV; ++v) qv[v] = _mm256_loadu_ps(qt + (lat + c) * kW + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_broadcast_ss(rrow[r] + c);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(p, qv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float lanes[kW];
    for (int v = 0; v < NV; ++v) _mm256_store_ps(lanes + 8 * v, acc[r][v]);
    for (int64_t h = 0; h < nh; ++h) sc[h * ld + r] = lanes[h];
  }
}

// Scores of heads [h0, h0 + nh) (nh <= NV * 8) over context [0, ctx) into scores[h][s].
template <int NV, int R>
void head_group_scores(const AbsorbedQuery& q, int64_t h0, int64_t nh, const LatentKvView& kv,
                       int64_t ctx, float* scores, float* qt) {
  constexpr int kW = NV * 8;
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  for (int64_t c = 0; c < lat + dr; ++c) {
    for (int64_t j = 0; j < kW; ++j) {
      qt[c * kW + j] = j >= nh    ? 0.0f
                       : c < lat ? q.q_abs[(h0 + j) * q.q_abs_ld + c]
                                 : q.q_pe[(h0 + j) * q.q_pe_ld + (c - lat)];
    }
  }
  int64_t s = 0;
  for (; s + R <= ctx; s += R) scores_rows<NV, R>(qt, kv, s, nh, scores + s, ctx);
  for (; s < ctx; ++s) scores_rows<NV, 1>(qt, kv, s, nh, scores + s, ctx);
}

}  // namespace

void mla_absorbed_attention(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                            const LatentKvView& kv, int64_t ctx, float scale, float* scores) {
  const int64_t nh = head_end - head_begin;
  const int64_t bs = kv.block_size, lat = kv.latent_dim, dr = kv.rope_dim;
  // scores[j, s] = (q_abs[j]·latent(s) + q_pe[j]·rope(s)) · scale, 16 heads (or 8) at a time.
  thread_local std::vector<float> qt;
  qt.resize(static_cast<size_t>((lat + dr) * 16));
  for (int64_t g = 0; g < nh; g += 16) {
    const int64_t gh = std::min<int64_t>(16, nh - g);
    float* sc = scores + g * ctx;
    if (gh > 8) {
      head_group_scores<2, 4>(q, head_begin + g, gh, kv, ctx, sc, qt.data());
    } else {
      head_group_scores<1, 8>(q, head_begin + g, gh, kv, ctx, sc, qt.data());
    }
  }
  for (int64_t j = 0; j < nh; ++j) {
    float* row = scores + j * ctx;
    for (int64_t s = 0; s < ctx; ++s) row[s] *= scale;
    softmax_inplace(row, ctx);
    std::memset(q.out + (head_begin + j) * q.out_ld, 0, sizeof(float) * static_cast<size_t>(lat));
  }
  // out[j] = Σ_s p[j, s] latent(s): per block, [nh, rows]·[rows, C] accumulated.
  for (int64_t s0 = 0; s0 < ctx; s0 += bs) {
    const int64_t rows = std::min(bs, ctx - s0);
    const MatrixRef lat_block{DType::kF32, kv.latent_at(s0), rows, lat};
    matmul_nn_accumulate(scores + s0, nh, ctx, lat_block, q.out + head_begin * q.out_ld, q.out_ld);
  }
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

#include "kernels/cpu/mla_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"

namespace xds::kernels {
namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void mla_absorbed_attention(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                            const LatentKvView& kv, int64_t ctx, float scale, float* scores) {
  const int64_t nh = head_end - head_begin;
  const int64_t bs = kv.block_size, lat = kv.latent_dim, dr = kv.rope_dim;
  // Per cache block, the heads' scores are two small products with the register-blocked
  // kernels: scores[j, s] = q_abs[j]·latent(s) + q_pe[j]·rope(s)   ([nh, C]·[bs, C]ᵀ).
  float rope_part[64 * 16];  // [nh <= 64, bs <= 16] scratch for the rope term
  const bool small = nh <= 64 && bs <= 16;
  for (int64_t s0 = 0; s0 < ctx; s0 += bs) {
    const int64_t rows = std::min(bs, ctx - s0);
    const MatrixRef lat_block{DType::kF32, kv.latent_at(s0), rows, lat};
    const MatrixRef rope_block{DType::kF32, kv.rope_at(s0), rows, dr};
    float* sc = scores + s0;
    linear_f32_serial(q.q_abs + head_begin * q.q_abs_ld, nh, q.q_abs_ld, lat_block, sc, ctx);
    if (small) {
      linear_f32_serial(q.q_pe + head_begin * q.q_pe_ld, nh, q.q_pe_ld, rope_block, rope_part, rows);
      for (int64_t j = 0; j < nh; ++j) {
        for (int64_t i = 0; i < rows; ++i) sc[j * ctx + i] = (sc[j * ctx + i] + rope_part[j * rows + i]) * scale;
      }
    } else {
      for (int64_t j = 0; j < nh; ++j) {
        for (int64_t i = 0; i < rows; ++i) {
          sc[j * ctx + i] = (sc[j * ctx + i] + dot(q.q_pe + (head_begin + j) * q.q_pe_ld, kv.rope_at(s0 + i), dr)) * scale;
        }
      }
    }
  }
  for (int64_t j = 0; j < nh; ++j) {
    softmax_inplace(scores + j * ctx, ctx);
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

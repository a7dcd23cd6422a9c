#include "kernels/cpu/mla_attention.h"

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

}  // namespace xds::kernels

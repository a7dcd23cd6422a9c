// Qwen3-MoE attention of one layer for a step (qwen3_moe.h): projections, per-head q/k
// RMSNorm, rotate-half RoPE, the cache write, GQA attention over the paged cache, o_proj.
#include <cmath>

#include "base/grow.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "model/qwen3_moe/qwen3_moe.h"

namespace xds {

void Qwen3MoeModel::run_attention(int64_t layer, KvStorage& kv, const float* xn, float* out) {
  const GqaWeights& w = weights_.layers[static_cast<size_t>(layer)].attn;
  const int64_t n = step_.n(), d = config_.hidden_size, dh = config_.head_dim;
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t q_width = heads * dh, kv_width = kv_heads * dh;
  float* q = grow(s_q_, n * q_width);   // [n, H·Dh]
  float* k = grow(s_k_, n * kv_width);  // [n, KV·Dh]
  float* v = grow(s_v_, n * kv_width);  // [n, KV·Dh]
  const kernels::LinearOutput qkv[] = {
      {&w.q_proj, q, q_width}, {&w.k_proj, k, kv_width}, {&w.v_proj, v, kv_width}};
  linear_->group(xn, n, d, qkv);
  // Per token: RMSNorm each head of q and k over Dh, rotate at its position, then store
  // K and V at the position (every row of the step before any attention reads them).
  const double eps = config_.rms_norm_eps;
  pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cs = rope_->cos_sin(step_.pos(t));
      for (int64_t h = 0; h < heads; ++h) {
        float* row = q + t * q_width + h * dh;
        kernels::rmsnorm(row, w.q_norm.data(), dh, eps, row);
        kernels::rope_rotate_half(row, dh, cs);
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        float* row = k + t * kv_width + h * dh;
        kernels::rmsnorm(row, w.k_norm.data(), dh, eps, row);
        kernels::rope_rotate_half(row, dh, cs);
      }
    }
  });
  float* attn = grow(s_attn_, n * q_width);  // [n, H·Dh]
  GqaLayerIo io;
  io.layer = layer;
  io.heads = heads;
  io.kv_heads = kv_heads;
  io.head_dim = dh;
  io.scale = 1.0f / std::sqrt(static_cast<float>(dh));
  io.q = q;
  io.k = k;
  io.v = v;
  io.out = attn;
  attention_.run(step_, kv, io, *pool_);
  (*linear_)(attn, n, q_width, w.o_proj, out, d);
}

}  // namespace xds

// GLM-4.5 attention of one layer for a step (glm4_moe.h): projections with their biases,
// the optional per-head q/k RMSNorm, rotate-half RoPE over each head's first rotary_dim dims,
// then the cache write and GQA attention over the paged cache (GqaAttention), o_proj.
#include <cmath>

#include "base/grow.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "model/glm4_moe/glm4_moe.h"

namespace xds {
namespace {

// row[i] += bias[i] for i < width (no-op for an empty bias).
void add_bias(float* row, std::span<const float> bias) {
  for (size_t i = 0; i < bias.size(); ++i) row[i] += bias[i];
}

}  // namespace

void Glm4MoeModel::run_attention(const Glm4AttentionWeights& w, int64_t layer, KvStorage& kv,
                                 const float* xn, float* out) {
  const int64_t n = step_.n(), d = config_.hidden_size, dh = config_.head_dim;
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t q_width = heads * dh, kv_width = kv_heads * dh;
  const int64_t rotary = config_.rotary_dim();
  float* q = grow(s_q_, n * q_width);   // [n, H·Dh]
  float* k = grow(s_k_, n * kv_width);  // [n, KV·Dh]
  float* v = grow(s_v_, n * kv_width);  // [n, KV·Dh]
  const kernels::LinearOutput qkv[] = {
      {&w.q_proj, q, q_width}, {&w.k_proj, k, kv_width}, {&w.v_proj, v, kv_width}};
  linear_->group(xn, n, d, qkv);
  // Per token: the biases, then per head of q and k the RMSNorm over Dh (use_qk_norm) and the
  // rotation of its first `rotary` dims at the token's position.
  const double eps = config_.rms_norm_eps;
  const bool qk_norm = !w.q_norm.empty();
  pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cs = rope_->cos_sin(step_.pos(t));
      add_bias(q + t * q_width, w.q_bias);
      add_bias(k + t * kv_width, w.k_bias);
      add_bias(v + t * kv_width, w.v_bias);
      for (int64_t h = 0; h < heads; ++h) {
        float* row = q + t * q_width + h * dh;
        if (qk_norm) kernels::rmsnorm(row, w.q_norm.data(), dh, eps, row);
        kernels::rope_rotate_half(row, rotary, cs);
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        float* row = k + t * kv_width + h * dh;
        if (qk_norm) kernels::rmsnorm(row, w.k_norm.data(), dh, eps, row);
        kernels::rope_rotate_half(row, rotary, cs);
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

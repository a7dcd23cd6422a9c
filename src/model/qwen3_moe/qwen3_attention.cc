// Qwen3-MoE attention of one layer for a step (qwen3_moe.h): projections, per-head q/k
// RMSNorm, rotate-half RoPE, the cache write, GQA attention over the paged cache, o_proj.
#include <algorithm>
#include <cmath>

#include "base/grow.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "model/gqa_kv.h"
#include "model/qwen3_moe/qwen3_moe.h"

namespace xds {
namespace {

// Tokens of a chunk that one attention item takes: a prefill tile reads each K/V block once
// for all its tokens' query heads.
constexpr int64_t kTokenTile = 16;

}  // namespace

void Qwen3MoeModel::run_attention(int64_t layer, KvStorage& kv, const float* xn, float* out) {
  const GqaWeights& w = weights_.layers[static_cast<size_t>(layer)].attn;
  const int64_t n = n_, d = config_.hidden_size, dh = config_.head_dim;
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t group = config_.group_size();
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
      const float* cs = rope_->cos_sin(pos_[t]);
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
  const int64_t bs = kv.block_size();
  for (const Chunk& ch : chunks_) {
    for (int64_t i = 0; i < ch.count; ++i) {
      const int64_t p = ch.start_pos + i, t = ch.begin + i;
      gqa_kv_write(kv, layer, ch.blocks[p / bs], p % bs, k + t * kv_width, v + t * kv_width);
    }
  }
  // Items: (chunk, KV head, tile of up to kTokenTile tokens), over the pool.
  s_items_.clear();
  for (int64_t c = 0; c < static_cast<int64_t>(chunks_.size()); ++c) {
    for (int64_t first = 0; first < chunks_[c].count; first += kTokenTile) {
      for (int64_t h = 0; h < kv_heads; ++h)
        s_items_.push_back({c, h, first, std::min(kTokenTile, chunks_[c].count - first)});
    }
  }
  float* attn = grow(s_attn_, n * q_width);  // [n, H·Dh]
  const int64_t per_thread = kernels::gqa_scratch_floats(kTokenTile, group, bs, dh);
  float* scratch_all = grow(s_attn_scratch_, per_thread * pool_->num_threads());
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  pool_->parallel_for(
      static_cast<int64_t>(s_items_.size()), [&](int64_t i0, int64_t i1, int thread) {
        float* scratch = scratch_all + per_thread * thread;
        for (int64_t i = i0; i < i1; ++i) {
          const AttentionItem& it = s_items_[static_cast<size_t>(i)];
          const Chunk& ch = chunks_[static_cast<size_t>(it.chunk)];
          const int64_t t = ch.begin + it.first;
          kernels::GqaQueries gq;
          gq.q = q + t * q_width + it.head * group * dh;
          gq.ld = q_width;
          gq.m = it.count;
          gq.group = group;
          gq.first_pos = ch.start_pos + it.first;
          gq.scale = scale;
          gq.out = attn + t * q_width + it.head * group * dh;
          gq.out_ld = q_width;
          kernels::gqa_attention(gq, gqa_kv_view(kv, layer, it.head, ch.blocks), scratch);
        }
      });
  (*linear_)(attn, n, q_width, w.o_proj, out, d);
}

}  // namespace xds

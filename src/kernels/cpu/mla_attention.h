// MLA attention over the paged latent KV cache (the weight-absorbed form).
//
// The cache keeps, per layer, two planes of fixed-size blocks:
//   latent: [num_blocks, block_size, C]   c = kv_a_layernorm(kv_a[:C])   (C = kv_lora_rank)
//   rope:   [num_blocks, block_size, Dr]  k_pe after rotation            (Dr = qk_rope_head_dim)
// Context position s of a sequence lives in block block_table[s / block_size], slot
// s % block_size.
//
// For one query token and heads [h0, h1):
//   score[h, s] = (q_abs[h]·latent(s) + q_pe[h]·rope(s)) * scale,  s < ctx
//   p = softmax_s(score);  out[h] = Σ_s p[h, s] latent(s)                 [H, C]
// q_abs[h] = W_UK[h]ᵀ q_nope[h] (absorbed), so out still needs W_UV[h] applied by the caller.
#pragma once

#include <cstdint>

namespace xds::kernels {

struct LatentKvView {
  const float* latent = nullptr;  // [num_blocks, block_size, latent_dim]
  const float* rope = nullptr;    // [num_blocks, block_size, rope_dim]
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;
  int64_t latent_dim = 0;
  int64_t rope_dim = 0;

  const float* latent_at(int64_t s) const {
    return latent + (block_table[s / block_size] * block_size + s % block_size) * latent_dim;
  }
  const float* rope_at(int64_t s) const {
    return rope + (block_table[s / block_size] * block_size + s % block_size) * rope_dim;
  }
};

// q_abs: [heads, latent_dim] (row stride q_abs_ld), q_pe: [heads, rope_dim] (stride q_pe_ld),
// out: [heads, latent_dim] (stride out_ld). scores: scratch of at least ctx floats.
struct AbsorbedQuery {
  const float* q_abs;
  int64_t q_abs_ld;
  const float* q_pe;
  int64_t q_pe_ld;
  float* out;
  int64_t out_ld;
};

// Heads [head_begin, head_end) of one query token over context [0, ctx). Each cached
// position is read once for all those heads (the latent is shared by every head, MQA-like).
// scores: scratch of at least (head_end - head_begin) * ctx floats.
void mla_absorbed_attention(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                            const LatentKvView& kv, int64_t ctx, float scale, float* scores);

}  // namespace xds::kernels

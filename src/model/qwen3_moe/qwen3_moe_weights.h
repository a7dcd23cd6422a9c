// The Qwen3-MoE weights in the published layout, bound in the kernels' layout (MatrixRef into
// the checkpoint's mmap, or a shared repack file for F16 checkpoints). D = hidden, H query
// heads, KV heads, Dh = head_dim, E experts, I = moe_intermediate_size. Tensor names:
//   model.embed_tokens.weight                      [vocab, D]
//   model.layers.N.input_layernorm.weight          [D]
//   model.layers.N.self_attn.q_proj.weight         [H·Dh, D]
//   model.layers.N.self_attn.k_proj.weight         [KV·Dh, D]
//   model.layers.N.self_attn.v_proj.weight         [KV·Dh, D]
//   model.layers.N.self_attn.o_proj.weight         [D, H·Dh]
//   model.layers.N.self_attn.{q,k}_norm.weight     [Dh]  (one RMSNorm shared by every head)
//   model.layers.N.post_attention_layernorm.weight [D]
//   sparse layers: model.layers.N.mlp.gate.weight  [E, D] (the router)
//                  model.layers.N.mlp.experts.E.{gate,up}_proj.weight [I, D], down_proj [D, I]
//   dense layers:  model.layers.N.mlp.{gate,up}_proj.weight [intermediate_size, D], down_proj
//   model.norm.weight [D]; lm_head.weight [vocab, D] unless tie_word_embeddings
// The MoE layers bind into the family-independent MoeWeights (no score bias, no shared
// experts), which the local and expert-parallel exchanges run.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/moe_weights.h"
#include "model/qwen3_moe/config.h"
#include "tensor/matrix.h"

namespace xds {

class Checkpoint;
class RepackCache;

struct GqaWeights {
  MatrixRef q_proj;               // [H·Dh, D]
  MatrixRef k_proj;               // [KV·Dh, D]
  MatrixRef v_proj;               // [KV·Dh, D]
  MatrixRef o_proj;               // [D, H·Dh]
  std::span<const float> q_norm;  // [Dh]
  std::span<const float> k_norm;  // [Dh]
};

struct Qwen3MoeLayerWeights {
  std::span<const float> input_norm;      // [D]
  std::span<const float> post_attn_norm;  // [D]
  GqaWeights attn;
  std::optional<MlpWeights> dense;  // mlp_only_layers and the sparse step's gaps
  std::optional<MoeWeights> moe;
};

struct Qwen3MoeWeights {
  MatrixRef embed;                           // [vocab, D]
  std::vector<Qwen3MoeLayerWeights> layers;  // [num_hidden_layers]
  std::span<const float> final_norm;         // [D]
  MatrixRef lm_head;                         // [vocab, D] (the embedding when tied)
};

// Binds every tensor the config calls for; an error names the file, the tensor, the expected
// and the found shape/dtype. `store` owns converted copies and repack mappings.
Result<Qwen3MoeWeights> bind_qwen3_moe_weights(const Qwen3MoeConfig& config, const Checkpoint& ckpt,
                                               RepackCache& store);

}  // namespace xds

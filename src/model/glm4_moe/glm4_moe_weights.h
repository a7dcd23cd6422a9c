// The GLM-4.5 weights in the published layout, bound in the kernels' layout (MatrixRef into
// the checkpoint's mmap, or a shared repack file for F16 checkpoints). D = hidden, H query
// heads, KV heads, Dh = head_dim, E routed experts, I = moe_intermediate_size, S =
// n_shared_experts, L = num_hidden_layers. Tensor names:
//   model.embed_tokens.weight                          [vocab, D]
//   model.layers.N.input_layernorm.weight              [D]
//   model.layers.N.self_attn.q_proj.{weight,bias}      [H·Dh, D], [H·Dh] (bias: attention_bias)
//   model.layers.N.self_attn.k_proj.{weight,bias}      [KV·Dh, D], [KV·Dh]
//   model.layers.N.self_attn.v_proj.{weight,bias}      [KV·Dh, D], [KV·Dh]
//   model.layers.N.self_attn.o_proj.weight             [D, H·Dh] (never a bias)
//   model.layers.N.self_attn.{q,k}_norm.weight         [Dh] (use_qk_norm; shared by the heads)
//   model.layers.N.post_attention_layernorm.weight     [D]
//   dense layers (N < first_k_dense_replace):
//     model.layers.N.mlp.{gate,up}_proj.weight [intermediate_size, D], down_proj [D, ...]
//   MoE layers:
//     model.layers.N.mlp.gate.weight                   [E, D] (the router)
//     model.layers.N.mlp.gate.e_score_correction_bias  [E]
//     model.layers.N.mlp.experts.E.{gate,up}_proj.weight [I, D], down_proj [D, I]
//     model.layers.N.mlp.shared_experts.{gate,up}_proj.weight [S·I, D], down_proj [D, S·I]
//   model.norm.weight [D]; lm_head.weight [vocab, D] unless tie_word_embeddings
//   MTP layer k at N = L + k (num_nextn_predict_layers; vLLM's glm4_moe_mtp):
//     model.layers.N.{enorm,hnorm}.weight [D]; model.layers.N.eh_proj.weight [D, 2D];
//     model.layers.N.shared_head.norm.weight [D]; shared_head.head.weight [vocab, D] (else
//     lm_head); embed_tokens.weight [vocab, D] (else the model's); and a whole decoder layer
//     (a MoE one) under model.layers.N.
// The MoE layers bind into the family-independent MoeWeights (correction bias, shared
// experts), which the local and expert-parallel exchanges run.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/glm4_moe/config.h"
#include "model/moe_weights.h"
#include "tensor/matrix.h"

namespace xds {

class Checkpoint;
class RepackCache;

struct Glm4AttentionWeights {
  MatrixRef q_proj;               // [H·Dh, D]
  MatrixRef k_proj;               // [KV·Dh, D]
  MatrixRef v_proj;               // [KV·Dh, D]
  MatrixRef o_proj;               // [D, H·Dh]
  std::span<const float> q_bias;  // [H·Dh]; empty without attention_bias
  std::span<const float> k_bias;  // [KV·Dh]
  std::span<const float> v_bias;  // [KV·Dh]
  std::span<const float> q_norm;  // [Dh]; empty without use_qk_norm
  std::span<const float> k_norm;  // [Dh]
};

struct Glm4LayerWeights {
  std::span<const float> input_norm;      // [D]
  std::span<const float> post_attn_norm;  // [D]
  Glm4AttentionWeights attn;
  std::optional<MlpWeights> dense;  // layers [0, first_k_dense_replace)
  std::optional<MoeWeights> moe;
};

struct Glm4MtpWeights {
  MatrixRef embed;                      // [vocab, D] (the model's unless the layer has its own)
  std::span<const float> enorm, hnorm;  // [D]
  MatrixRef eh_proj;                    // [D, 2D]: columns [0, D) embedding, [D, 2D) hidden
  std::span<const float> head_norm;     // [D] shared_head.norm
  MatrixRef head;                       // [vocab, D] shared_head.head (or lm_head)
  Glm4LayerWeights layer;
};

struct Glm4MoeWeights {
  MatrixRef embed;                       // [vocab, D]
  std::vector<Glm4LayerWeights> layers;  // [num_hidden_layers]
  std::span<const float> final_norm;     // [D]
  MatrixRef lm_head;                     // [vocab, D] (the embedding when tied)
  std::vector<Glm4MtpWeights> mtp;       // [num_nextn_predict_layers]
};

// Binds every tensor the config calls for; an error names the file, the tensor, the expected
// and the found shape/dtype. `store` owns converted copies and repack mappings.
Result<Glm4MoeWeights> bind_glm4_moe_weights(const Glm4MoeConfig& config, const Checkpoint& ckpt,
                                             RepackCache& store);

}  // namespace xds

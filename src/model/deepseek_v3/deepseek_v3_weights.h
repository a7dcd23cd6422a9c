// The DeepSeek-V3 weights, bound in the kernels' layout (MatrixRef into the checkpoint's
// mmap, or into a shared repack file for F16/FP8 checkpoints). Tensor names and shapes:
// docs/design/deepseek_v3_forward.md. D = hidden, H = heads, C = kv_lora_rank. The MLPs and
// MoE layers bind into the family-independent MlpWeights / MoeWeights (model/moe_weights.h):
// router = mlp.gate.weight, score_bias = e_score_correction_bias, shared width
// n_shared_experts * moe_intermediate_size.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/deepseek_v3/config.h"
#include "model/moe_weights.h"
#include "tensor/matrix.h"

namespace xds {

class Checkpoint;
class RepackCache;

struct MlaWeights {
  std::optional<MatrixRef> q_a_proj;  // [Q, D]            (q_lora_rank set)
  std::span<const float> q_a_norm;    // [Q]
  std::optional<MatrixRef> q_b_proj;  // [H*(Dn+Dr), Q]
  std::optional<MatrixRef> q_proj;    // [H*(Dn+Dr), D]    (q_lora_rank null)
  MatrixRef kv_a_proj;                // [C+Dr, D]
  std::span<const float> kv_a_norm;   // [C]
  MatrixRef kv_b_proj;                // [H*(Dn+Dv), C]: per head Dn rows of W_UK, Dv of W_UV
                                      // (panels where uk_t/uv exist, else rows: sliced;
                                      // int8 panels for a W8A8 kv_b_proj)
  std::vector<MatrixRef> uk_t, uv;    // per head, panels: W_UK[h]ᵀ [C, Dn], W_UV[h] [Dv, C]
                                      // (weights.h bind_absorbed_heads; empty: slice kv_b)
  std::span<const float> uk_scale;    // [H, Dn]: int8 heads only (W8A8 kv_b_proj): the
                                      // W_UK rows' scales, folded into q_nope before uk_t
  MatrixRef o_proj;                   // [D, H*Dv]
};

struct LayerWeights {
  std::span<const float> input_norm;      // [D]
  std::span<const float> post_attn_norm;  // [D]
  MlaWeights attn;
  std::optional<MlpWeights> dense;  // first_k_dense layers
  std::optional<MoeWeights> moe;
};

struct MtpWeights {
  MatrixRef embed;                      // [vocab, D] (the main embedding if not stored)
  std::span<const float> enorm, hnorm;  // [D]
  MatrixRef eh_proj;                    // [D, 2D]: columns [0, D) embedding, [D, 2D) hidden
  std::span<const float> head_norm;     // [D] shared_head.norm
  MatrixRef head;                       // [vocab, D] shared_head.head (or lm_head)
  LayerWeights layer;
};

struct DeepseekV3Weights {
  MatrixRef embed;                    // [vocab, D]
  std::vector<LayerWeights> layers;   // [num_hidden_layers]
  std::span<const float> final_norm;  // [D]
  MatrixRef lm_head;                  // [vocab, D]
  std::vector<MtpWeights> mtp;        // [num_nextn_predict_layers]
};

// Binds every tensor the config calls for; an error names the file, the tensor, the
// expected and the found shape/dtype. `store` owns converted copies and repack mappings.
Result<DeepseekV3Weights> bind_deepseek_v3_weights(const DeepseekV3Config& config,
                                                   const Checkpoint& ckpt, RepackCache& store);

}  // namespace xds

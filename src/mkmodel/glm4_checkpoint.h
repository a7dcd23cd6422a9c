// mkmodel --arch glm4_moe: random-weight GLM-4.5 checkpoints in the published Hugging Face
// layout (config.json with Glm4MoeForCausalLM's keys as zai-org/GLM-4.5 publishes them,
// generation_config.json, model.safetensors or shards + index; tensor names:
// model/glm4_moe/glm4_moe_weights.h), weights by mkmodel's rule (write_random_tensors); the
// q/k/v biases and e_score_correction_bias U(-0.05, 0.05), the latter F32 as published.
//
// Preset tiny: vocab 256, hidden 64, 4 query / 2 KV heads of head_dim 32 (≠ 64 / 4),
// partial_rotary_factor 0.5 (16 rotated dims), 3 layers with layer 0 dense
// (first_k_dense_replace 1), 8 routed experts of 32 in 2 groups (topk_group 1), top-2,
// norm_topk_prob, × 2.5, one shared expert, attention_bias and use_qk_norm, untied, one MTP
// layer (a few MB).
// Options used: out_dir, preset, dtype (bf16 or f16), seed, shards, mtp_layers,
// partial_rotary_factor, attention_bias, qk_norm, max_position_embeddings, threads; the
// quantized, yarn and router-skew options are refused.
#pragma once

#include "base/status.h"
#include "mkmodel/mkmodel.h"
#include "model/glm4_moe/config.h"

namespace xds {

// The config a preset describes (InvalidArgument naming an unknown preset or option).
Result<Glm4MoeConfig> glm4_mkmodel_config(const MkModelOptions& o);

Status write_glm4_checkpoint(const MkModelOptions& o);

}  // namespace xds

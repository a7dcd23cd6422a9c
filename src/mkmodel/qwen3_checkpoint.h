// mkmodel --arch qwen3_moe: random-weight Qwen3-MoE checkpoints in the published Hugging Face
// layout (config.json as Qwen3MoeForCausalLM's, generation_config.json, model.safetensors or
// shards + index; tensor names: model/qwen3_moe/qwen3_moe_weights.h), weights by mkmodel's
// rule (write_random_tensors).
//
// Presets:
//   tiny         vocab 256, hidden 64, 4 query / 2 KV heads of head_dim 32 (≠ 64 / 4), 3
//                layers, layer 0 dense (mlp_only_layers), 8 experts of 32, top-2,
//                norm_topk_prob, untied (a few MB)
//   bench-qwen3  Qwen3-30B-A3B's layer shape with 6 layers: hidden 2048, 32 query / 4 KV heads
//                of 128, 128 experts of 768, top-8, vocab 151936, untied (~4.3 B parameters,
//                ~8.7 GB in bf16)
// Options used: out_dir, preset, dtype (bf16 or f16), seed, shards, yarn (factor 4, original
// max_position_embeddings / 4), max_position_embeddings, threads; the quantized, router-skew
// and MTP options are refused.
#pragma once

#include "base/status.h"
#include "mkmodel/mkmodel.h"
#include "model/qwen3_moe/config.h"

namespace xds {

// The config a preset describes (InvalidArgument naming an unknown preset or option).
Result<Qwen3MoeConfig> qwen3_mkmodel_config(const MkModelOptions& o);

Status write_qwen3_checkpoint(const MkModelOptions& o);

}  // namespace xds

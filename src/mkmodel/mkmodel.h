// mkmodel: random-weight checkpoints of the DeepSeek family — DeepSeek-V3, Kimi K2 (kimi_k2),
// DeepSeek-V2 / V2-Lite (deepseek_v2) — in the published Hugging Face layout (config.json,
// generation_config.json, model.safetensors or shards + index), for tests and benchmarks.
// Tensor names and shapes: docs/design/deepseek_v3_forward.md; a DeepSeek-V2 gate has no
// e_score_correction_bias.
//
// Weights are a pure function of (seed, tensor name, element index) (splitmix64 counters),
// so output does not depend on the thread count. Scales: Linear weights uniform with std
// 1/sqrt(fan_in); embeddings uniform [-1, 1); norms 1 + U(-0.1, 0.1); the router with std
// 2/sqrt(hidden) so that sigmoid scores spread; e_score_correction_bias U(-0.05, 0.05), F32
// (with router_skew, fitted to a Zipf law of expert selection instead: router_skew.h).
// With dtype fp8, every 2-D *_proj.weight of attention and MLP/experts is F8_E4M3 with
// F32 `<name>_scale_inv` per 128x128 block (scale = block max |w| / 448); embeddings, norms,
// router, lm_head and eh_proj stay BF16. With dtype f16, every tensor that is BF16 in bf16
// is F16 (config.json's torch_dtype "float16"), as fp16 checkpoints publish them.
// Tensors are generated and written one at a time (a few MB in memory), in parallel.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/deepseek_v3/config.h"
#include "tensor/dtype.h"

namespace xds {

struct MkModelOptions {
  std::string out_dir;
  // "tiny" (a few MB) | "bench-2.6b" (~5.9 GB in bf16) | "bench-qwen3" (qwen3_moe only)
  std::string preset = "tiny";
  // config.json's model_type: "deepseek_v3"; "kimi_k2" (one expert group, × 2.827,
  // rope_theta 50000, YaRN factor 32 with beta 1/1 as published); "deepseek_v2" (softmax
  // scores, no correction bias, norm_topk_prob false: group_limited_greedy × 16 as
  // DeepSeek-V2, or with q_lora false DeepSeek-V2-Lite's greedy over one group × 1);
  // "qwen3_moe" (qwen3_checkpoint.h: presets tiny and bench-qwen3; bf16 or f16, shards,
  // yarn, seed; no quantized, router-skew or MTP options); "glm4_moe" (glm4_checkpoint.h:
  // preset tiny; bf16 or f16, shards, seed, MTP layers and the GLM options below).
  std::string arch = "deepseek_v3";
  std::string dtype = "bf16";   // "bf16" | "f16" | "fp8" (block FP8 as published)
  uint64_t seed = 0;
  int shards = 1;     // 1: model.safetensors; n > 1: n files + index.json
  bool yarn = false;  // rope_scaling yarn, factor 4
  // max_position_embeddings in config.json; unset: the preset's (tiny 512, bench-2.6b 4096).
  // >= 1; with yarn a multiple of its factor 4 (original_max_position_embeddings = N / 4).
  std::optional<int64_t> max_position_embeddings;
  bool q_lora = true;    // false: q_proj instead of q_a_proj/q_b_proj
  // num_nextn_predict_layers; unset: what the arch publishes (deepseek_v3 and glm4_moe 1,
  // the others 0).
  std::optional<int> mtp_layers;
  // glm4_moe only (glm4_checkpoint.h): partial_rotary_factor (unset: 0.5 as published),
  // attention_bias and use_qk_norm (true as GLM-4.5 publishes; false as GLM-4.5-Air).
  std::optional<double> partial_rotary_factor;
  bool attention_bias = true;
  bool qk_norm = true;
  // "zipf:A": the e_score_correction_bias of every MoE layer is fitted so that expert
  // selection follows 1 / (rank + 1)^A over a permutation of the experts seeded by
  // router_skew_seed and the layer (mkmodel/router_skew.h); "": U(-0.05, 0.05) as above.
  std::string router_skew;
  uint64_t router_skew_seed = 0;
  // W8A8 (compressed-tensors, round to nearest per output channel: quant/w8a8_rtn.h):
  // the random model's attention and MLP projections written as I8 + weight_scale, the
  // values rounded to `dtype` first, so that the same seed without it gives the float model
  // they were quantized from.
  bool weights_int8 = false;
  // With weights_int8: lm_head, the MTP layers' shared_head.head and every kv_b_proj
  // quantized the same way too (w8a8_rtn.h head_and_kv_b), dropped from `ignore`. With
  // weights_int4 (pack-quantized only): those modules in int8 by the same rule instead of 4
  // bits, in a second, int8 config group (model/quant_config.h layout 2b).
  bool int8_head_and_kv_b = false;
  // With weights_int8: instead of a random model, an RTN W8A8 copy of the (BF16, F16 or
  // F32) checkpoint in this directory: its config.json with quantization_config added, its
  // other files copied; preset, dtype, seed and router skew unused.
  std::string from_dir;
  // W4 (round to nearest per group of input columns: quant/w4_rtn.h, mkmodel/int4_checkpoint.h):
  // "sym" or "asym" ("": off). A 4-bit copy of the random model (or of from_dir's float
  // checkpoint): the projections W8A8 quantizes and kv_b_proj, where their input width is a
  // multiple of int4_group_size (the others stay float, named in ignore).
  std::string weights_int4;
  int64_t int4_group_size = 32;                // 32, 64 or 128
  std::string int4_format = "pack-quantized";  // compressed-tensors, or "gptq" (W4A16 only)
  bool int4_int8_activations = false;          // pack-quantized: a W4A8 config
  // "none" (column c in group c / G) or "group": activation reordering as published
  // (compressed-tensors actorder "group" with <m>.weight_g_idx, GPTQ desc_act with <m>.g_idx),
  // each module's columns grouped by a permutation seeded by seed and the module's name.
  std::string int4_actorder = "none";
  int threads = 0;       // 0: all hardware threads
  bool progress = true;  // a progress line on stderr for outputs > ~1 GB
};

// The config a preset and arch describe (before it is written; mkmodel_config.cc). Errors:
// unknown preset/dtype/arch, MTP layers or a router skew with deepseek_v2, a
// max_position_embeddings below 1 or (with yarn) not a multiple of 4, a router_skew that is
// not "zipf:A" with A in (0, 8].
Result<DeepseekV3Config> mkmodel_config(const MkModelOptions& opts);

// Writes the checkpoint into opts.out_dir (created if needed; existing files of the same
// names are replaced); with from_dir set, the W8A8 copy described above.
Status write_random_checkpoint(const MkModelOptions& opts);

// One tensor of another family's random checkpoint (qwen3_checkpoint.cc, glm4_checkpoint.cc),
// generated by this file's rule: kLinear U with std 1/sqrt(cols), kEmbed U(-1, 1), kNorm
// 1 + U(-0.1, 0.1), kRouter std 2/sqrt(cols); a pure function of (seed, name, element).
// kBias U(-0.05, 0.05) (biases, e_score_correction_bias).
enum class RandomInit { kLinear, kEmbed, kNorm, kRouter, kBias };
struct RandomTensor {
  std::string name;
  std::vector<int64_t> shape;
  RandomInit init = RandomInit::kLinear;
  bool f32 = false;  // written as F32 whatever the checkpoint's dtype (as published)
};
// Writes `tensors` in `dtype` (kBF16 or kF16) into o.out_dir as o.shards files (+ index).
Status write_random_tensors(const MkModelOptions& o, const std::vector<RandomTensor>& tensors,
                            DType dtype);

// f32 -> E4M3 (e4m3fn), round to nearest even, saturating to +-448, NaN -> 0x7f; the same
// results as xds::f32_to_f8e4m3, in a few operations.
uint8_t f32_to_f8e4m3_fast(float f);

}  // namespace xds

// Qwen3-MoE model configuration (Hugging Face `Qwen3MoeForCausalLM`, model_type
// "qwen3_moe"), read from `config.json` with the Qwen3MoeConfig field names (one table in
// config.cc), and the eos/bos ids from `generation_config.json`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/moe_routing.h"
#include "model/rope.h"

namespace xds {

struct Qwen3MoeConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // D
  int64_t intermediate_size = 0;      // dense MLP width (mlp_only_layers, sparse-step gaps)
  int64_t moe_intermediate_size = 0;  // I: a routed expert's width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;  // H query heads
  int64_t num_key_value_heads = 0;  // KV heads (H a multiple of it)
  int64_t head_dim = 0;             // Dh; config "head_dim", else D / H
  int64_t num_experts = 0;          // E routed experts per MoE layer (no shared experts)
  int64_t num_experts_per_tok = 0;  // top-k
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;  // layers with a dense MLP whatever the sparse step
  bool norm_topk_prob = false;           // Hugging Face's default
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // rope_scaling, type "yarn"
  int64_t max_position_embeddings = 32768;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // from generation_config.json (else config.json)

  // Hugging Face's rule: a layer is sparse unless listed in mlp_only_layers, when the model
  // has experts and (layer + 1) is a multiple of decoder_sparse_step.
  bool is_moe_layer(int64_t layer) const;
  int64_t group_size() const { return num_attention_heads / num_key_value_heads; }
};

// The router's rule: softmax over all experts, greedy top-k, normalised if norm_topk_prob.
GatingParams gating_params(const Qwen3MoeConfig& c);
// The rotary table (the whole head rotates; YaRN's attention factor scales cos and sin).
RopeParams rope_params(const Qwen3MoeConfig& c);

// Reads `dir/config.json` (and `dir/generation_config.json` if present). Every field used is
// validated; an error names the file and the field, what was expected and what was found.
Result<Qwen3MoeConfig> load_qwen3_moe_config(const std::string& dir);

// Parses config.json text (`source` names it in errors). Exposed for tests.
Result<Qwen3MoeConfig> parse_qwen3_moe_config(const std::string& json_text,
                                              const std::string& source);

}  // namespace xds

// GLM-4.5 / GLM-4.6 model configuration (Hugging Face `Glm4MoeForCausalLM`, model_type
// "glm4_moe"), read from `config.json` with the Glm4MoeConfig field names (one table in
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

struct Glm4MoeConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // D
  int64_t intermediate_size = 0;      // the dense layers' MLP width
  int64_t moe_intermediate_size = 0;  // I: a routed expert's width (shared: n_shared · I)
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;     // H query heads
  int64_t num_key_value_heads = 0;     // KV heads (H a multiple of it)
  int64_t head_dim = 0;                // Dh; config "head_dim", else D / H
  double partial_rotary_factor = 0.5;  // the first Dh · factor dims of a head rotate
  int64_t n_routed_experts = 0;        // E
  int64_t num_experts_per_tok = 0;     // top-k
  int64_t n_shared_experts = 1;
  int64_t first_k_dense_replace = 1;  // layers [0, k) have a dense MLP
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 131072;
  bool attention_bias = false;  // q, k and v projections with a bias (o_proj never)
  bool use_qk_norm = false;     // an RMSNorm over each head of q and of k before RoPE
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;  // MTP layers model.layers.{L + i}
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // from generation_config.json (else config.json)

  // The rotated dims of a head: int(head_dim · partial_rotary_factor), as transformers.
  int64_t rotary_dim() const;
  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
  int64_t group_size() const { return num_attention_heads / num_key_value_heads; }
};

// The router's rule: sigmoid scores, top-k on the scores plus e_score_correction_bias within
// the topk_group best of n_group groups, weights normalised if norm_topk_prob, then
// × routed_scaling_factor (DeepSeek-V3's noaux_tc).
GatingParams gating_params(const Glm4MoeConfig& c);
// The rotary table over the rotated dims (rotary_dim(); no scaling).
RopeParams rope_params(const Glm4MoeConfig& c);

// Reads `dir/config.json` (and `dir/generation_config.json` if present). Every field used is
// validated; an error names the file and the field, what was expected and what was found.
Result<Glm4MoeConfig> load_glm4_moe_config(const std::string& dir);

// Parses config.json text (`source` names it in errors). Exposed for tests.
Result<Glm4MoeConfig> parse_glm4_moe_config(const std::string& json_text,
                                            const std::string& source);

}  // namespace xds

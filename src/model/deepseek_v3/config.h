// DeepSeek-V3 model configuration, read from a Hugging Face `config.json` with the
// DeepseekV3 field names (the mapping lives in one table in config.cc), and the eos ids
// from `generation_config.json`. The same module family also describes Kimi K2
// (model_type kimi_k2, the DeepSeek-V3 computation) and DeepSeek-V2 / V2-Lite (model_type
// deepseek_v2: softmax routing without correction bias, and its own rule for
// routed_scaling_factor); DeepseekFamily says which one a config is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/moe_routing.h"
#include "model/quant_config.h"
#include "model/rope.h"

namespace xds {

struct Fp8Quantization {  // quantization_config with quant_method "fp8"
  int64_t block_rows = 128;  // weight_block_size[0]
  int64_t block_cols = 128;  // weight_block_size[1]
};

// Bounds on the sizes a config may give, so that no product the loader forms from them (a
// tensor's expected shape, heads × head dims × widths, its bytes) can overflow int64: an
// overflow wrapped to a checkpoint's real shape once, and a qk_nope_head_dim of 2^62 + 32
// with 4 heads loaded and crashed. Published models stay far below (DeepSeek-V3: hidden
// 7168, vocab 129280, 128 heads of 128 + 64, 61 layers).
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;  // vocab, hidden, MLP widths, lora ranks
inline constexpr int64_t kMaxHeadsOrHeadDim = int64_t{1} << 16;  // heads, per-head dims
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;          // decoder and MTP layers
inline constexpr int64_t kMaxSharedExperts = int64_t{1} << 10;

// config.json's model_type (or, without one, its architectures entry).
enum class DeepseekFamily {
  kDeepseekV3,  // "deepseek_v3", DeepseekV3ForCausalLM
  kKimiK2,      // "kimi_k2", DeepseekV3ForCausalLM: the DeepSeek-V3 computation
  kDeepseekV2,  // "deepseek_v2", DeepseekV2ForCausalLM
};

// "deepseek_v3", "kimi_k2" or "deepseek_v2".
const char* deepseek_model_type(DeepseekFamily family);

struct DeepseekV3Config {
  DeepseekFamily family = DeepseekFamily::kDeepseekV3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;        // dense MLP width (first_k_dense layers)
  int64_t moe_intermediate_size = 0;    // per-expert width
  int64_t num_hidden_layers = 0;
  int64_t num_nextn_predict_layers = 0; // MTP layers, stored at index num_hidden_layers
  int64_t num_attention_heads = 0;
  int64_t n_shared_experts = 0;
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;  // DeepSeek-V2's default: false
  GatingScore scoring_func = GatingScore::kSigmoid;  // scoring_func (DeepSeek-V2: softmax)
  TopkMethod topk_method = TopkMethod::kNoauxTc;     // topk_method (DeepSeek-V2: greedy)
  std::optional<int64_t> q_lora_rank;   // null in config.json: q_proj without low rank
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // rope_scaling, type "yarn"
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  std::optional<Fp8Quantization> fp8;    // present when the checkpoint is block-FP8
  std::optional<IntQuantization> int_quant;  // W8A8, W4A16 or W4A8 (quant_config.h)
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;   // from generation_config.json (else config.json)

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // True if decoder layer `layer` (0-based; the MTP layers included) uses MoE.
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace &&
           (layer % moe_layer_freq) == 0;
  }
};

// The router's rule of every MoE layer (DeepSeek-V2: routed_scaling_factor only on weights
// that norm_topk_prob did not normalise, RoutedScaling::kUnnormalizedOnly).
GatingParams gating_params(const DeepseekV3Config& c);
// The rotary table's parameters of MLA's rope part.
RopeParams rope_params(const DeepseekV3Config& c);

// Reads `dir/config.json` (and `dir/generation_config.json` if present). Every field used
// is validated; an error names the file and the field, what was expected and what was found.
Result<DeepseekV3Config> load_deepseek_v3_config(const std::string& dir);

// Parses config.json text (`source` names it in errors). Exposed for tests.
Result<DeepseekV3Config> parse_deepseek_v3_config(const std::string& json_text,
                                                  const std::string& source);

}  // namespace xds

// config.json / generation_config.json -> Qwen3MoeConfig.
//
// Every Hugging Face key that we read is listed once, in kFields below, with its parser and
// its constraint; keys whose only supported value is the default (sliding window, attention
// bias, the activation) are checked too, so that a checkpoint we would compute differently
// is refused rather than run. Cross-field rules follow in validate_cross_fields(). Errors read
//   "<file>: field '<key>': expected <what>, found <json value>".
#include "model/qwen3_moe/config.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/read_file.h"
#include "model/config_json.h"

namespace xds {
namespace {

using json = nlohmann::json;
using Config = Qwen3MoeConfig;
using config_json::cross_error;
using config_json::field_error;
using config_json::get_int;
using config_json::parse_bool_field;
using config_json::parse_int_field;
using config_json::parse_positive_field;
constexpr auto get_double = config_json::get_positive_double;

// Bounds that keep every product the loader forms (shapes, bytes) inside int64.
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxHeads = int64_t{1} << 12;
constexpr int64_t kMaxHeadDim = int64_t{1} << 12;
constexpr int64_t kMaxLayers = int64_t{1} << 12;

using FieldParser = Status (*)(std::string_view source, std::string_view key, const json& v,
                               Config& c);

// head_dim: an integer, or null (then hidden_size / num_attention_heads, as transformers).
Status parse_head_dim(std::string_view source, std::string_view key, const json& v, Config& c) {
  if (v.is_null()) return {};
  XDS_ASSIGN_OR_RETURN(c.head_dim, get_int(source, key, v, 2, kMaxHeadDim));
  return {};
}

Status parse_mlp_only_layers(std::string_view source, std::string_view key, const json& v,
                             Config& c) {
  c.mlp_only_layers.clear();
  if (v.is_null()) return {};
  if (!v.is_array()) return field_error(source, key, "a list of layer indices or null", v);
  for (const json& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0) {
      return field_error(source, key, "a list of layer indices >= 0", v);
    }
    c.mlp_only_layers.push_back(e.get<int64_t>());
  }
  return {};
}

Status parse_model_type(std::string_view source, std::string_view key, const json& v, Config&) {
  if (!v.is_string() || v.get<std::string>() != "qwen3_moe") {
    return field_error(source, key, "\"qwen3_moe\"", v);
  }
  return {};
}

Status parse_architectures(std::string_view source, std::string_view key, const json& v, Config&) {
  if (v.is_array()) {
    for (const json& a : v) {
      if (a.is_string() && a.get<std::string>() == "Qwen3MoeForCausalLM") return {};
    }
  }
  return field_error(source, key, "[\"Qwen3MoeForCausalLM\"]", v);
}

Status parse_hidden_act(std::string_view source, std::string_view key, const json& v, Config&) {
  if (!v.is_string() || v.get<std::string>() != "silu") {
    return field_error(source, key, "\"silu\"", v);
  }
  return {};
}

// A key whose only supported value is false (or null): attention_bias, use_sliding_window.
Status parse_false(std::string_view source, std::string_view key, const json& v, Config&) {
  if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return {};
  return field_error(source, key, "false (the only value supported)", v);
}

Status parse_quantization(std::string_view source, std::string_view key, const json& v, Config&) {
  if (v.is_null()) return {};
  return field_error(source, key,
                     "null or absent (quantized Qwen3-MoE checkpoints are not supported yet)", v);
}

// rope_scaling: null/absent (plain rope) or {"rope_type" (or "type"): "yarn", "factor", ...};
// original_max_position_embeddings defaults to the config's max_position_embeddings, read
// after this table (cross-field), so it is kept at 0 here when absent.
Status parse_rope_scaling(std::string_view source, std::string_view key, const json& v, Config& c) {
  c.rope_scaling.reset();
  if (v.is_null()) return {};
  if (!v.is_object()) return field_error(source, key, "an object or null", v);
  const std::string k(key);
  const json* type = v.contains("rope_type") ? &v["rope_type"]
                     : v.contains("type")    ? &v["type"]
                                             : nullptr;
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "yarn") {
    return field_error(source, k + ".rope_type", "\"yarn\" (the only rope scaling supported)",
                       type ? *type : json());
  }
  RopeScaling r;
  r.original_max_position_embeddings = 0;
  if (!v.contains("factor")) return field_error(source, k + ".factor", "a number >= 1", json());
  XDS_ASSIGN_OR_RETURN(r.factor, get_double(source, k + ".factor", v["factor"]));
  if (r.factor < 1.0) return field_error(source, k + ".factor", "a number >= 1", v["factor"]);
  if (v.contains("original_max_position_embeddings") &&
      !v["original_max_position_embeddings"].is_null()) {
    XDS_ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                         get_int(source, k + ".original_max_position_embeddings",
                                 v["original_max_position_embeddings"], 1));
  }
  for (const char* name : {"beta_fast", "beta_slow"}) {
    if (!v.contains(name) || v[name].is_null()) continue;
    XDS_ASSIGN_OR_RETURN(const double d, get_double(source, k + "." + name, v[name]));
    (std::string_view(name) == "beta_fast" ? r.beta_fast : r.beta_slow) = d;
  }
  for (const char* name : {"attention_factor", "mscale", "mscale_all_dim", "truncate"}) {
    if (v.contains(name) && !v[name].is_null()) {
      return field_error(source, k + "." + name, "absent (not supported for Qwen3-MoE yet)",
                         v[name]);
    }
  }
  c.rope_scaling = r;
  return {};
}

struct FieldSpec {
  const char* key;  // the Hugging Face config.json key
  bool required;    // absent -> error; otherwise the Qwen3MoeConfig default stays
  FieldParser parse;
};

// The one table of Hugging Face keys. Keys not listed here are ignored (output_router_logits,
// router_aux_loss_coef, attention_dropout, initializer_range, torch_dtype, use_cache,
// sliding_window and max_window_layers, which only matter with use_sliding_window).
constexpr FieldSpec kFields[] = {
    {"architectures", false, parse_architectures},
    {"model_type", false, parse_model_type},
    {"vocab_size", true, parse_int_field<&Config::vocab_size, 1, kMaxWidth>},
    {"hidden_size", true, parse_int_field<&Config::hidden_size, 1, kMaxWidth>},
    {"intermediate_size", true, parse_int_field<&Config::intermediate_size, 1, kMaxWidth>},
    {"moe_intermediate_size", true, parse_int_field<&Config::moe_intermediate_size, 1, kMaxWidth>},
    {"num_hidden_layers", true, parse_int_field<&Config::num_hidden_layers, 1, kMaxLayers>},
    {"num_attention_heads", true, parse_int_field<&Config::num_attention_heads, 1, kMaxHeads>},
    {"num_key_value_heads", true, parse_int_field<&Config::num_key_value_heads, 1, kMaxHeads>},
    {"head_dim", false, parse_head_dim},
    {"num_experts", true, parse_int_field<&Config::num_experts, 0, kMaxRoutedExperts>},
    {"num_experts_per_tok", true,
     parse_int_field<&Config::num_experts_per_tok, 1, kMaxRoutedExperts>},
    {"decoder_sparse_step", false, parse_int_field<&Config::decoder_sparse_step, 1, kMaxLayers>},
    {"mlp_only_layers", false, parse_mlp_only_layers},
    {"norm_topk_prob", false, parse_bool_field<&Config::norm_topk_prob>},
    {"rms_norm_eps", false, parse_positive_field<&Config::rms_norm_eps>},
    {"rope_theta", false, parse_positive_field<&Config::rope_theta>},
    {"rope_scaling", false, parse_rope_scaling},
    {"max_position_embeddings", false,
     parse_int_field<&Config::max_position_embeddings, 1, INT64_MAX>},
    {"tie_word_embeddings", false, parse_bool_field<&Config::tie_word_embeddings>},
    {"hidden_act", false, parse_hidden_act},
    {"attention_bias", false, parse_false},
    {"use_sliding_window", false, parse_false},
    {"quantization_config", false, parse_quantization},
    {"bos_token_id", false, config_json::parse_bos<Config>},
    {"eos_token_id", false, config_json::parse_eos<Config>},
};

Status validate_cross_fields(std::string_view source, const json& j, Config& c) {
  if (!j.contains("architectures") && !j.contains("model_type")) {
    return invalid_argument(
        "{}: field 'model_type': expected \"qwen3_moe\" (or architectures "
        "[\"Qwen3MoeForCausalLM\"]), found neither",
        source);
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return cross_error(source, "head_dim",
                         fmt::format("an integer (hidden_size {} is not a multiple of "
                                     "num_attention_heads {})",
                                     c.hidden_size, c.num_attention_heads),
                         0);
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) {
    return cross_error(source, "head_dim", "an even number (rope rotates halves)", c.head_dim);
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return cross_error(source, "num_key_value_heads",
                       fmt::format("a divisor of num_attention_heads ({})", c.num_attention_heads),
                       c.num_key_value_heads);
  }
  if (c.num_experts > 0 && c.num_experts_per_tok > c.num_experts) {
    return cross_error(source, "num_experts_per_tok",
                       fmt::format("<= num_experts ({})", c.num_experts), c.num_experts_per_tok);
  }
  for (int64_t l : c.mlp_only_layers) {
    if (l >= c.num_hidden_layers) {
      return cross_error(source, "mlp_only_layers",
                         fmt::format("layer indices < num_hidden_layers ({})", c.num_hidden_layers),
                         l);
    }
  }
  if (c.rope_scaling && c.rope_scaling->original_max_position_embeddings == 0) {
    c.rope_scaling->original_max_position_embeddings = c.max_position_embeddings;
  }
  return config_json::check_token_ids(source, c.eos_token_ids, c.bos_token_id, c.vocab_size);
}

}  // namespace

bool Qwen3MoeConfig::is_moe_layer(int64_t layer) const {
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return false;
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

Result<Qwen3MoeConfig> parse_qwen3_moe_config(const std::string& json_text,
                                              const std::string& source) {
  XDS_ASSIGN_OR_RETURN(json j, config_json::parse_object(json_text, source));
  Config c;
  for (const FieldSpec& f : kFields) {
    auto it = j.find(f.key);
    if (it == j.end()) {
      if (f.required) {
        return invalid_argument("{}: field '{}': required but missing", source, f.key);
      }
      continue;
    }
    XDS_RETURN_IF_ERROR(f.parse(source, f.key, *it, c));
  }
  XDS_RETURN_IF_ERROR(validate_cross_fields(source, j, c));
  return c;
}

Result<Qwen3MoeConfig> load_qwen3_moe_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  XDS_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  XDS_ASSIGN_OR_RETURN(Config c, parse_qwen3_moe_config(text, path));
  XDS_ASSIGN_OR_RETURN(const std::string gen_path,
                       config_json::apply_generation_config(dir, c.eos_token_ids, c.bos_token_id));
  if (gen_path.empty()) return c;
  XDS_RETURN_IF_ERROR(
      config_json::check_token_ids(gen_path, c.eos_token_ids, c.bos_token_id, c.vocab_size));
  return c;
}

GatingParams gating_params(const Qwen3MoeConfig& c) {
  GatingParams p;
  p.num_experts = c.num_experts;
  p.top_k = c.num_experts_per_tok;
  p.score = GatingScore::kSoftmax;
  p.method = TopkMethod::kGreedy;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = 1.0;
  return p;
}

RopeParams rope_params(const Qwen3MoeConfig& c) {
  RopeParams p;
  p.dim = c.head_dim;
  p.qk_head_dim = c.head_dim;
  p.theta = c.rope_theta;
  p.scaling = c.rope_scaling;  // mscale 1, mscale_all_dim 0: cos/sin × (0.1·ln(factor) + 1)
  return p;
}

}  // namespace xds

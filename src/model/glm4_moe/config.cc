// config.json / generation_config.json -> Glm4MoeConfig.
//
// Every Hugging Face key that we read is listed once, in kFields below, with its parser and
// its constraint; keys whose only supported value is the default (the activation, rope
// scaling, quantization) are checked too, so that a checkpoint we would compute differently
// is refused rather than run. Cross-field rules follow in validate_cross_fields(). Errors read
//   "<file>: field '<key>': expected <what>, found <json value>".
#include "model/glm4_moe/config.h"

#include <cmath>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/read_file.h"
#include "model/config_json.h"

namespace xds {
namespace {

using json = nlohmann::json;
using Config = Glm4MoeConfig;
using config_json::cross_error;
using config_json::field_error;
using config_json::get_int;
using config_json::parse_bool_field;
using config_json::parse_int_field;
using config_json::parse_positive_field;

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

Status parse_partial_rotary(std::string_view source, std::string_view key, const json& v,
                            Config& c) {
  if (!v.is_number() || !(v.get<double>() > 0) || !(v.get<double>() <= 1)) {
    return field_error(source, key, "a number in (0, 1]", v);
  }
  c.partial_rotary_factor = v.get<double>();
  return {};
}

Status parse_model_type(std::string_view source, std::string_view key, const json& v, Config&) {
  if (!v.is_string() || v.get<std::string>() != "glm4_moe") {
    return field_error(source, key, "\"glm4_moe\"", v);
  }
  return {};
}

Status parse_architectures(std::string_view source, std::string_view key, const json& v, Config&) {
  if (v.is_array()) {
    for (const json& a : v) {
      if (a.is_string() && a.get<std::string>() == "Glm4MoeForCausalLM") return {};
    }
  }
  return field_error(source, key, "[\"Glm4MoeForCausalLM\"]", v);
}

Status parse_hidden_act(std::string_view source, std::string_view key, const json& v, Config&) {
  if (!v.is_string() || v.get<std::string>() != "silu") {
    return field_error(source, key, "\"silu\"", v);
  }
  return {};
}

// A key whose only supported value is null: rope_scaling (GLM-4.5 publishes plain rope),
// quantization_config.
Status parse_null(std::string_view source, std::string_view key, const json& v, Config&) {
  if (v.is_null()) return {};
  return field_error(source, key, "null or absent (the only value supported for GLM-4.5)", v);
}

struct FieldSpec {
  const char* key;  // the Hugging Face config.json key
  bool required;    // absent -> error; otherwise the Glm4MoeConfig default stays
  FieldParser parse;
};

// The one table of Hugging Face keys. Keys not listed here are ignored (attention_dropout,
// initializer_range, pad_token_id, torch_dtype, use_cache, transformers_version).
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
    {"partial_rotary_factor", false, parse_partial_rotary},
    {"n_routed_experts", true, parse_int_field<&Config::n_routed_experts, 1, kMaxRoutedExperts>},
    {"num_experts_per_tok", true,
     parse_int_field<&Config::num_experts_per_tok, 1, kMaxRoutedExperts>},
    {"n_shared_experts", false, parse_int_field<&Config::n_shared_experts, 0, kMaxHeads>},
    {"first_k_dense_replace", false,
     parse_int_field<&Config::first_k_dense_replace, 0, kMaxLayers>},
    {"n_group", false, parse_int_field<&Config::n_group, 1, kMaxExpertGroups>},
    {"topk_group", false, parse_int_field<&Config::topk_group, 1, kMaxExpertGroups>},
    {"norm_topk_prob", false, parse_bool_field<&Config::norm_topk_prob>},
    {"routed_scaling_factor", false, parse_positive_field<&Config::routed_scaling_factor>},
    {"rms_norm_eps", false, parse_positive_field<&Config::rms_norm_eps>},
    {"rope_theta", false, parse_positive_field<&Config::rope_theta>},
    {"rope_scaling", false, parse_null},
    {"max_position_embeddings", false, parse_int_field<&Config::max_position_embeddings, 1>},
    {"attention_bias", false, parse_bool_field<&Config::attention_bias>},
    {"use_qk_norm", false, parse_bool_field<&Config::use_qk_norm>},
    {"tie_word_embeddings", false, parse_bool_field<&Config::tie_word_embeddings>},
    {"num_nextn_predict_layers", false,
     parse_int_field<&Config::num_nextn_predict_layers, 0, kMaxLayers>},
    {"hidden_act", false, parse_hidden_act},
    {"quantization_config", false, parse_null},
    {"bos_token_id", false, config_json::parse_bos<Config>},
    {"eos_token_id", false, config_json::parse_eos<Config>},
};

Status validate_cross_fields(std::string_view source, const json& j, Config& c) {
  if (!j.contains("architectures") && !j.contains("model_type")) {
    return invalid_argument(
        "{}: field 'model_type': expected \"glm4_moe\" (or architectures "
        "[\"Glm4MoeForCausalLM\"]), found neither",
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
  const int64_t rotary = c.rotary_dim();
  if (rotary < 2 || rotary % 2 != 0) {
    return invalid_argument(
        "{}: field 'partial_rotary_factor': expected head_dim ({}) x factor to give an even "
        "number of rotated dims >= 2, found {} (-> {})",
        source, c.head_dim, c.partial_rotary_factor, rotary);
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return cross_error(source, "num_key_value_heads",
                       fmt::format("a divisor of num_attention_heads ({})", c.num_attention_heads),
                       c.num_key_value_heads);
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return cross_error(source, "num_experts_per_tok",
                       fmt::format("<= n_routed_experts ({})", c.n_routed_experts),
                       c.num_experts_per_tok);
  }
  if (c.n_routed_experts % c.n_group != 0) {
    return cross_error(source, "n_group",
                       fmt::format("a divisor of n_routed_experts ({})", c.n_routed_experts),
                       c.n_group);
  }
  if (c.topk_group > c.n_group) {
    return cross_error(source, "topk_group", fmt::format("<= n_group ({})", c.n_group),
                       c.topk_group);
  }
  // Every chosen expert must fit in the chosen groups, and a group ranks by its best two.
  if (c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group)) {
    return cross_error(source, "num_experts_per_tok",
                       fmt::format("<= topk_group x experts per group ({})",
                                   c.topk_group * (c.n_routed_experts / c.n_group)),
                       c.num_experts_per_tok);
  }
  if (c.n_group > 1 && c.n_routed_experts / c.n_group < 2) {
    return cross_error(source, "n_group",
                       "at most n_routed_experts / 2 (a group ranks by its two best scores)",
                       c.n_group);
  }
  return config_json::check_token_ids(source, c.eos_token_ids, c.bos_token_id, c.vocab_size);
}

}  // namespace

int64_t Glm4MoeConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

Result<Glm4MoeConfig> parse_glm4_moe_config(const std::string& json_text,
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

Result<Glm4MoeConfig> load_glm4_moe_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  XDS_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  XDS_ASSIGN_OR_RETURN(Config c, parse_glm4_moe_config(text, path));
  XDS_ASSIGN_OR_RETURN(const std::string gen_path,
                       config_json::apply_generation_config(dir, c.eos_token_ids, c.bos_token_id));
  if (gen_path.empty()) return c;
  XDS_RETURN_IF_ERROR(
      config_json::check_token_ids(gen_path, c.eos_token_ids, c.bos_token_id, c.vocab_size));
  return c;
}

GatingParams gating_params(const Glm4MoeConfig& c) {
  GatingParams p;
  p.num_experts = c.n_routed_experts;
  p.top_k = c.num_experts_per_tok;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.score = GatingScore::kSigmoid;
  p.method = TopkMethod::kNoauxTc;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = c.routed_scaling_factor;
  p.scaling = RoutedScaling::kAlways;
  return p;
}

RopeParams rope_params(const Glm4MoeConfig& c) {
  RopeParams p;
  p.dim = c.rotary_dim();
  p.qk_head_dim = c.head_dim;
  p.theta = c.rope_theta;
  return p;
}

}  // namespace xds

// config.json / generation_config.json -> DeepseekV3Config.
//
// Every Hugging Face key that we read is listed once, in kFields below, with its parser
// and its constraint; cross-field rules (divisibility, gating method vs scoring) follow in
// validate_cross_fields(). Errors read
//   "<file>: field '<key>': expected <what>, found <json value>".
#include "model/deepseek_v3/config.h"

#include <cmath>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/read_file.h"
#include "model/config_json.h"

namespace xds {
namespace {

using json = nlohmann::json;
using Config = DeepseekV3Config;
using config_json::cross_error;
using config_json::field_error;
using config_json::get_int;

Result<double> get_double(std::string_view source, std::string_view key, const json& v,
                          bool positive) {
  const char* what = positive ? "a finite number > 0" : "a finite number";
  if (!v.is_number()) return field_error(source, key, what, v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || (positive && !(d > 0))) return field_error(source, key, what, v);
  return d;
}

Result<bool> get_bool(std::string_view source, std::string_view key, const json& v) {
  if (!v.is_boolean()) return field_error(source, key, "true or false", v);
  return v.get<bool>();
}

Result<std::string> get_string(std::string_view source, std::string_view key, const json& v) {
  if (!v.is_string()) return field_error(source, key, "a string", v);
  return v.get<std::string>();
}

// Parsers for one key: they read `v` (present, possibly null) into the config.
using FieldParser = Status (*)(std::string_view source, std::string_view key, const json& v,
                               Config& c);

template <int64_t Config::*M, int64_t kMin, int64_t kMax = INT64_MAX>
Status parse_int(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(c.*M, get_int(source, key, v, kMin, kMax));
  return {};
}

template <double Config::*M, bool kPositive>
Status parse_double(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(c.*M, get_double(source, key, v, kPositive));
  return {};
}

template <bool Config::*M>
Status parse_bool(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(c.*M, get_bool(source, key, v));
  return {};
}

Status parse_q_lora_rank(std::string_view source, std::string_view key, const json& v, Config& c) {
  if (v.is_null()) {
    c.q_lora_rank.reset();
    return {};
  }
  auto rank = get_int(source, key, v, 1, kMaxWidth);
  if (!rank.ok()) {
    return field_error(source, key, fmt::format("an integer in [1, {}] or null", kMaxWidth), v);
  }
  c.q_lora_rank = *rank;
  return {};
}

Status parse_scoring_func(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(std::string s, get_string(source, key, v));
  if (s == "sigmoid") {
    c.scoring_func = GatingScore::kSigmoid;
  } else if (s == "softmax") {
    c.scoring_func = GatingScore::kSoftmax;
  } else {
    return field_error(source, key, "\"sigmoid\" or \"softmax\"", v);
  }
  return {};
}

Status parse_topk_method(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(std::string s, get_string(source, key, v));
  if (s == "noaux_tc") {
    c.topk_method = TopkMethod::kNoauxTc;
  } else if (s == "greedy") {
    c.topk_method = TopkMethod::kGreedy;
  } else if (s == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else {
    return field_error(source, key, "\"noaux_tc\", \"greedy\" or \"group_limited_greedy\"", v);
  }
  return {};
}

Status parse_hidden_act(std::string_view source, std::string_view key, const json& v, Config&) {
  if (!v.is_string() || v.get<std::string>() != "silu") {
    return field_error(source, key, "\"silu\"", v);
  }
  return {};
}

Status parse_attention_bias(std::string_view source, std::string_view key, const json& v, Config&) {
  if (!v.is_boolean() || v.get<bool>()) return field_error(source, key, "false", v);
  return {};
}

struct FamilyRow {
  DeepseekFamily family;
  const char* model_type;
  const char* architecture;
};

constexpr FamilyRow kFamilies[] = {
    {DeepseekFamily::kDeepseekV3, "deepseek_v3", "DeepseekV3ForCausalLM"},
    {DeepseekFamily::kKimiK2, "kimi_k2", "DeepseekV3ForCausalLM"},
    {DeepseekFamily::kDeepseekV2, "deepseek_v2", "DeepseekV2ForCausalLM"},
};

// model_type picks the family; architectures, when present, must name its class. Without a
// model_type, the first family whose class architectures names.
Result<DeepseekFamily> parse_family(std::string_view source, const json& j) {
  const FamilyRow* row = nullptr;
  if (j.contains("model_type")) {
    const json& t = j["model_type"];
    for (const FamilyRow& f : kFamilies) {
      if (t.is_string() && t.get<std::string>() == f.model_type) row = &f;
    }
    if (row == nullptr) {
      return field_error(source, "model_type",
                         "\"deepseek_v3\", \"kimi_k2\" or \"deepseek_v2\" (the DeepSeek family)",
                         t);
    }
  }
  if (j.contains("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array()) return field_error(source, "architectures", "a list of class names", a);
    for (const json& name : a) {
      if (!name.is_string()) continue;
      for (const FamilyRow& f : kFamilies) {
        if (name.get<std::string>() != f.architecture) continue;
        if (row == nullptr) row = &f;
        if (row->architecture == name.get<std::string>()) return row->family;
      }
    }
    const std::string want =
        row != nullptr ? fmt::format("[\"{}\"] (model_type {})", row->architecture, row->model_type)
                       : "[\"DeepseekV3ForCausalLM\"] or [\"DeepseekV2ForCausalLM\"]";
    return field_error(source, "architectures", want, a);
  }
  if (row == nullptr) {
    return invalid_argument(
        "{}: field 'model_type': expected \"deepseek_v3\", \"kimi_k2\" or \"deepseek_v2\" (or "
        "architectures [\"DeepseekV3ForCausalLM\"] or [\"DeepseekV2ForCausalLM\"]), found neither",
        source);
  }
  return row->family;
}

// rope_scaling: null/absent (plain rope) or {"type" (or "rope_type"): "yarn", ...}.
Status parse_rope_scaling(std::string_view source, std::string_view key, const json& v, Config& c) {
  if (v.is_null()) {
    c.rope_scaling.reset();
    return {};
  }
  if (!v.is_object()) return field_error(source, key, "an object or null", v);
  const std::string k = std::string(key);
  const json* type = nullptr;
  if (v.contains("type")) type = &v["type"];
  if (type == nullptr && v.contains("rope_type")) type = &v["rope_type"];
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "yarn") {
    return field_error(source, k + ".type", "\"yarn\" (the only rope scaling supported)",
                       type ? *type : json());
  }
  RopeScaling r;
  if (!v.contains("factor")) return field_error(source, k + ".factor", "a number >= 1", json());
  XDS_ASSIGN_OR_RETURN(r.factor, get_double(source, k + ".factor", v["factor"], true));
  if (r.factor < 1.0) return field_error(source, k + ".factor", "a number >= 1", v["factor"]);
  if (!v.contains("original_max_position_embeddings")) {
    return field_error(source, k + ".original_max_position_embeddings", "an integer >= 1", json());
  }
  XDS_ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                       get_int(source, k + ".original_max_position_embeddings",
                               v["original_max_position_embeddings"], 1));
  struct Opt {
    const char* name;
    double* out;
    bool positive;
  };
  const Opt opts[] = {{"beta_fast", &r.beta_fast, true},
                      {"beta_slow", &r.beta_slow, true},
                      {"mscale", &r.mscale, false},
                      {"mscale_all_dim", &r.mscale_all_dim, false}};
  for (const Opt& o : opts) {
    if (!v.contains(o.name) || v[o.name].is_null()) continue;
    XDS_ASSIGN_OR_RETURN(*o.out, get_double(source, k + "." + o.name, v[o.name], o.positive));
  }
  c.rope_scaling = r;
  return {};
}

// quantization_config: absent/null (plain checkpoint), compressed-tensors W8A8 / W4A16 / W4A8
// or GPTQ W4A16
// (quant_config.h), or the published block-FP8 one:
// {"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8","weight_block_size":[128,128]}
Status parse_quantization(std::string_view source, std::string_view key, const json& v, Config& c) {
  if (v.is_null()) {
    c.fp8.reset();
    c.int_quant.reset();
    return {};
  }
  if (!v.is_object()) return field_error(source, key, "an object or null", v);
  const std::string k = std::string(key);
  const json method = v.value("quant_method", json());
  if (method == "compressed-tensors" || method == "gptq") {
    XDS_ASSIGN_OR_RETURN(c.int_quant, parse_int_quantization(source, key, v));
    c.fp8.reset();
    return {};
  }
  if (!method.is_string() || method.get<std::string>() != "fp8") {
    return field_error(source, k + ".quant_method",
                       "\"fp8\", \"compressed-tensors\" (W8A8, W4A16, W4A8) or \"gptq\" (W4A16; "
                       "model/quant_config.h)",
                       method);
  }
  const json fmt_v = v.value("fmt", json());
  if (!fmt_v.is_string() || fmt_v.get<std::string>() != "e4m3") {
    return field_error(source, k + ".fmt", "\"e4m3\"", fmt_v);
  }
  if (v.contains("activation_scheme")) {
    const json& a = v["activation_scheme"];
    if (!a.is_string() || a.get<std::string>() != "dynamic") {
      return field_error(source, k + ".activation_scheme", "\"dynamic\"", a);
    }
  }
  const json bs = v.value("weight_block_size", json());
  const char* what = "a list of two integers >= 1, e.g. [128, 128]";
  if (!bs.is_array() || bs.size() != 2 || !bs[0].is_number_integer() ||
      !bs[1].is_number_integer() || bs[0].get<int64_t>() < 1 || bs[1].get<int64_t>() < 1) {
    return field_error(source, k + ".weight_block_size", what, bs);
  }
  Fp8Quantization q;
  q.block_rows = bs[0].get<int64_t>();
  q.block_cols = bs[1].get<int64_t>();
  c.fp8 = q;
  c.int_quant.reset();
  return {};
}

struct FieldSpec {
  const char* key;  // the Hugging Face config.json key
  bool required;    // absent -> error; otherwise the DeepseekV3Config default stays
  FieldParser parse;
};

// The one table of Hugging Face keys (model_type and architectures are read first, by
// parse_family, since the family sets the defaults). Keys not listed here are ignored.
constexpr FieldSpec kFields[] = {
    {"vocab_size", true, parse_int<&Config::vocab_size, 1, kMaxWidth>},
    {"hidden_size", true, parse_int<&Config::hidden_size, 1, kMaxWidth>},
    {"intermediate_size", true, parse_int<&Config::intermediate_size, 1, kMaxWidth>},
    {"moe_intermediate_size", true, parse_int<&Config::moe_intermediate_size, 1, kMaxWidth>},
    {"num_hidden_layers", true, parse_int<&Config::num_hidden_layers, 1, kMaxLayers>},
    {"num_nextn_predict_layers", false,
     parse_int<&Config::num_nextn_predict_layers, 0, kMaxLayers>},
    {"num_attention_heads", true, parse_int<&Config::num_attention_heads, 1, kMaxHeadsOrHeadDim>},
    {"n_shared_experts", false, parse_int<&Config::n_shared_experts, 0, kMaxSharedExperts>},
    {"n_routed_experts", true, parse_int<&Config::n_routed_experts, 1>},
    {"num_experts_per_tok", true, parse_int<&Config::num_experts_per_tok, 1>},
    {"n_group", false, parse_int<&Config::n_group, 1>},
    {"topk_group", false, parse_int<&Config::topk_group, 1>},
    {"first_k_dense_replace", false, parse_int<&Config::first_k_dense_replace, 0>},
    {"moe_layer_freq", false, parse_int<&Config::moe_layer_freq, 1>},
    {"routed_scaling_factor", false, parse_double<&Config::routed_scaling_factor, true>},
    {"norm_topk_prob", false, parse_bool<&Config::norm_topk_prob>},
    {"scoring_func", false, parse_scoring_func},
    {"topk_method", false, parse_topk_method},
    {"q_lora_rank", true, parse_q_lora_rank},
    {"kv_lora_rank", true, parse_int<&Config::kv_lora_rank, 1, kMaxWidth>},
    {"qk_nope_head_dim", true, parse_int<&Config::qk_nope_head_dim, 1, kMaxHeadsOrHeadDim>},
    {"qk_rope_head_dim", true, parse_int<&Config::qk_rope_head_dim, 2, kMaxHeadsOrHeadDim>},
    {"v_head_dim", true, parse_int<&Config::v_head_dim, 1, kMaxHeadsOrHeadDim>},
    {"rms_norm_eps", false, parse_double<&Config::rms_norm_eps, true>},
    {"rope_theta", false, parse_double<&Config::rope_theta, true>},
    {"rope_scaling", false, parse_rope_scaling},
    {"max_position_embeddings", false, parse_int<&Config::max_position_embeddings, 1>},
    {"tie_word_embeddings", false, parse_bool<&Config::tie_word_embeddings>},
    {"quantization_config", false, parse_quantization},
    {"hidden_act", false, parse_hidden_act},
    {"attention_bias", false, parse_attention_bias},
    {"bos_token_id", false, config_json::parse_bos<Config>},
    {"eos_token_id", false, config_json::parse_eos<Config>},
};

// DeepSeek-V2's MoEGate computes softmax scores only and knows greedy and
// group_limited_greedy; it has no MTP layers.
Status validate_deepseek_v2(std::string_view source, const Config& c) {
  if (c.scoring_func != GatingScore::kSoftmax) {
    return invalid_argument(
        "{}: field 'scoring_func': expected \"softmax\" (model_type deepseek_v2), found "
        "\"sigmoid\"",
        source);
  }
  if (c.topk_method == TopkMethod::kNoauxTc) {
    return invalid_argument(
        "{}: field 'topk_method': expected \"greedy\" or \"group_limited_greedy\" (model_type "
        "deepseek_v2), found \"noaux_tc\"",
        source);
  }
  if (c.num_nextn_predict_layers != 0) {
    return cross_error(source, "num_nextn_predict_layers",
                       "0 (model_type deepseek_v2 has no MTP layers)", c.num_nextn_predict_layers);
  }
  return {};
}

Status validate_cross_fields(std::string_view source, const Config& c) {
  if (c.family == DeepseekFamily::kDeepseekV2) XDS_RETURN_IF_ERROR(validate_deepseek_v2(source, c));
  if (c.qk_rope_head_dim % 2 != 0) {
    return cross_error(source, "qk_rope_head_dim", "an even number (rope rotates pairs)",
                       c.qk_rope_head_dim);
  }
  if (c.n_routed_experts > kMaxRoutedExperts) {
    return cross_error(source, "n_routed_experts", fmt::format("<= {}", kMaxRoutedExperts),
                       c.n_routed_experts);
  }
  if (c.n_group > kMaxExpertGroups) {
    return cross_error(source, "n_group", fmt::format("<= {}", kMaxExpertGroups), c.n_group);
  }
  if (c.n_routed_experts % c.n_group != 0) {
    return cross_error(source, "n_routed_experts",
                       fmt::format("a multiple of n_group ({})", c.n_group), c.n_routed_experts);
  }
  if (c.topk_group > c.n_group) {
    return cross_error(source, "topk_group", fmt::format("<= n_group ({})", c.n_group),
                       c.topk_group);
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return cross_error(source, "num_experts_per_tok",
                       fmt::format("<= n_routed_experts ({})", c.n_routed_experts),
                       c.num_experts_per_tok);
  }
  const int64_t per_group = c.n_routed_experts / c.n_group;
  if (c.topk_method != TopkMethod::kGreedy && c.num_experts_per_tok > c.topk_group * per_group) {
    return cross_error(
        source, "num_experts_per_tok",
        fmt::format("<= topk_group * experts per group ({} * {})", c.topk_group, per_group),
        c.num_experts_per_tok);
  }
  if (c.topk_method == TopkMethod::kNoauxTc) {
    if (c.scoring_func != GatingScore::kSigmoid) {
      return invalid_argument(
          "{}: field 'scoring_func': expected \"sigmoid\" (topk_method noaux_tc requires it), "
          "found \"softmax\"",
          source);
    }
    if (per_group < 2) {
      return cross_error(source, "n_group",
                         fmt::format("a group size (n_routed_experts / n_group) >= 2 for "
                                     "noaux_tc group scores, n_routed_experts is {}",
                                     c.n_routed_experts),
                         c.n_group);
    }
  }
  if (c.first_k_dense_replace > c.num_hidden_layers) {
    return cross_error(source, "first_k_dense_replace",
                       fmt::format("<= num_hidden_layers ({})", c.num_hidden_layers),
                       c.first_k_dense_replace);
  }
  return config_json::check_token_ids(source, c.eos_token_ids, c.bos_token_id, c.vocab_size);
}

}  // namespace

Result<DeepseekV3Config> parse_deepseek_v3_config(const std::string& json_text,
                                                  const std::string& source) {
  XDS_ASSIGN_OR_RETURN(json j, config_json::parse_object(json_text, source));
  Config c;
  XDS_ASSIGN_OR_RETURN(c.family, parse_family(source, j));
  if (c.family == DeepseekFamily::kDeepseekV2) {  // DeepseekV2Config's defaults
    c.scoring_func = GatingScore::kSoftmax;
    c.topk_method = TopkMethod::kGreedy;
    c.norm_topk_prob = false;
  }
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
  XDS_RETURN_IF_ERROR(validate_cross_fields(source, c));
  return c;
}

Result<DeepseekV3Config> load_deepseek_v3_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  XDS_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  XDS_ASSIGN_OR_RETURN(Config c, parse_deepseek_v3_config(text, path));
  XDS_ASSIGN_OR_RETURN(const std::string gen_path,
                       config_json::apply_generation_config(dir, c.eos_token_ids, c.bos_token_id));
  if (gen_path.empty()) return c;
  XDS_RETURN_IF_ERROR(
      config_json::check_token_ids(gen_path, c.eos_token_ids, c.bos_token_id, c.vocab_size));
  return c;
}

GatingParams gating_params(const DeepseekV3Config& c) {
  GatingParams p;
  p.num_experts = c.n_routed_experts;
  p.top_k = c.num_experts_per_tok;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.score = c.scoring_func;
  p.method = c.topk_method;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = c.routed_scaling_factor;
  p.scaling = c.family == DeepseekFamily::kDeepseekV2 ? RoutedScaling::kUnnormalizedOnly
                                                      : RoutedScaling::kAlways;
  return p;
}

const char* deepseek_model_type(DeepseekFamily family) {
  for (const FamilyRow& f : kFamilies) {
    if (f.family == family) return f.model_type;
  }
  return "deepseek_v3";
}

RopeParams rope_params(const DeepseekV3Config& c) {
  RopeParams p;
  p.dim = c.qk_rope_head_dim;
  p.qk_head_dim = c.qk_head_dim();
  p.theta = c.rope_theta;
  p.scaling = c.rope_scaling;
  return p;
}

}  // namespace xds

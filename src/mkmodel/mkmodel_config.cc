// mkmodel's configs per architecture: the shapes of a preset, then what each family
// publishes (config.json field values as in deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct,
// deepseek-ai/DeepSeek-V2 and DeepSeek-V2-Lite).
#include "mkmodel/mkmodel_config.h"

#include "mkmodel/mkmodel.h"
#include "mkmodel/router_skew.h"

namespace xds {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int64_t kBlock = 128;  // FP8 block size (published layout)

Result<DeepseekFamily> family_of(const std::string& arch) {
  for (DeepseekFamily f :
       {DeepseekFamily::kDeepseekV3, DeepseekFamily::kKimiK2, DeepseekFamily::kDeepseekV2}) {
    if (arch == deepseek_model_type(f)) return f;
  }
  return invalid_argument(
      "mkmodel: unknown arch \"{}\" (expected \"deepseek_v3\", \"kimi_k2\", \"deepseek_v2\", "
      "\"qwen3_moe\" or \"glm4_moe\")",
      arch);
}

// What the family publishes beyond the preset's shapes, and its MTP layers.
Status apply_family(const MkModelOptions& o, DeepseekV3Config& c) {
  const int default_mtp = c.family == DeepseekFamily::kDeepseekV3 ? 1 : 0;
  const int mtp = o.mtp_layers.value_or(default_mtp);
  if (mtp < 0) return invalid_argument("mkmodel: mtp layers must be >= 0, got {}", mtp);
  c.num_nextn_predict_layers = mtp;
  switch (c.family) {
    case DeepseekFamily::kDeepseekV3:
      return {};
    case DeepseekFamily::kKimiK2: {
      // One expert group, × 2.827, rope_theta 50000 and YaRN factor 32 with beta 1 / 1 and
      // mscale 1 / 1, over max_position_embeddings / 32 original positions.
      c.n_group = 1;
      c.topk_group = 1;
      c.routed_scaling_factor = 2.827;
      c.rope_theta = 50000.0;
      constexpr int64_t kKimiYarnFactor = 32;
      if (c.max_position_embeddings % kKimiYarnFactor != 0) {
        return invalid_argument(
            "mkmodel: --max-position-embeddings {} with --arch kimi_k2 must be a multiple of its "
            "yarn factor {}",
            c.max_position_embeddings, kKimiYarnFactor);
      }
      RopeScaling r;
      r.factor = static_cast<double>(kKimiYarnFactor);
      r.original_max_position_embeddings = c.max_position_embeddings / kKimiYarnFactor;
      r.beta_fast = 1.0;
      r.beta_slow = 1.0;
      r.mscale = 1.0;
      r.mscale_all_dim = 1.0;
      c.rope_scaling = r;
      return {};
    }
    case DeepseekFamily::kDeepseekV2:
      if (mtp != 0) {
        return invalid_argument("mkmodel: --arch deepseek_v2 has no MTP layers (--mtp-layers {})",
                                mtp);
      }
      if (!o.router_skew.empty()) {
        return invalid_argument(
            "mkmodel: --router-skew fits e_score_correction_bias, which --arch deepseek_v2 has "
            "not");
      }
      c.scoring_func = GatingScore::kSoftmax;
      c.norm_topk_prob = false;
      if (c.q_lora_rank) {  // DeepSeek-V2: group-limited over the preset's groups, × 16
        c.topk_method = TopkMethod::kGroupLimitedGreedy;
        c.routed_scaling_factor = 16.0;
      } else {  // DeepSeek-V2-Lite: q_proj, plain top-k over one group, × 1
        c.topk_method = TopkMethod::kGreedy;
        c.n_group = 1;
        c.topk_group = 1;
        c.routed_scaling_factor = 1.0;
      }
      return {};
  }
  return {};
}

const char* topk_method_name(TopkMethod m) {
  switch (m) {
    case TopkMethod::kNoauxTc:
      return "noaux_tc";
    case TopkMethod::kGreedy:
      return "greedy";
    case TopkMethod::kGroupLimitedGreedy:
      return "group_limited_greedy";
  }
  return "noaux_tc";
}

}  // namespace

ojson mkmodel_config_json(const DeepseekV3Config& c) {
  const bool v2 = c.family == DeepseekFamily::kDeepseekV2;
  ojson j;
  j["architectures"] = {v2 ? "DeepseekV2ForCausalLM" : "DeepseekV3ForCausalLM"};
  j["model_type"] = deepseek_model_type(c.family);
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id ? ojson(*c.bos_token_id) : ojson(nullptr);
  j["eos_token_id"] = c.eos_token_ids.empty() ? ojson(nullptr) : ojson(c.eos_token_ids[0]);
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["n_group"] = c.n_group;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_attention_heads;
  if (!v2) j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["q_lora_rank"] = c.q_lora_rank ? ojson(*c.q_lora_rank) : ojson(nullptr);
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  if (c.fp8) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {c.fp8->block_rows, c.fp8->block_cols}}};
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (c.rope_scaling) {
    const RopeScaling& r = *c.rope_scaling;
    j["rope_scaling"] = {{"beta_fast", r.beta_fast},
                         {"beta_slow", r.beta_slow},
                         {"factor", r.factor},
                         {"mscale", r.mscale},
                         {"mscale_all_dim", r.mscale_all_dim},
                         {"original_max_position_embeddings", r.original_max_position_embeddings},
                         {"type", "yarn"}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_theta"] = c.rope_theta;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["scoring_func"] = c.scoring_func == GatingScore::kSigmoid ? "sigmoid" : "softmax";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["topk_group"] = c.topk_group;
  j["topk_method"] = topk_method_name(c.topk_method);
  j["torch_dtype"] = "bfloat16";
  j["use_cache"] = true;
  j["v_head_dim"] = c.v_head_dim;
  j["vocab_size"] = c.vocab_size;
  return j;
}

Result<DeepseekV3Config> mkmodel_config(const MkModelOptions& o) {
  DeepseekV3Config c;
  if (o.preset == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.moe_intermediate_size = 96;  // not a multiple of 128: partial FP8 blocks
    c.num_hidden_layers = 3;
    c.first_k_dense_replace = 1;
    c.num_attention_heads = 4;
    c.q_lora_rank = 128;
    c.kv_lora_rank = 96;  // kv_a rows 112, kv_b cols 96: partial blocks
    c.qk_nope_head_dim = 32;
    c.qk_rope_head_dim = 16;
    c.v_head_dim = 32;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 4;
    c.n_group = 4;
    c.topk_group = 2;
    c.n_shared_experts = 1;
    c.max_position_embeddings = 512;
  } else if (o.preset == "bench-2.6b") {
    c.vocab_size = 32000;
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.moe_intermediate_size = 512;
    c.num_hidden_layers = 12;
    c.first_k_dense_replace = 1;
    c.num_attention_heads = 16;
    c.q_lora_rank = 768;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.n_routed_experts = 64;
    c.num_experts_per_tok = 6;
    c.n_group = 8;
    c.topk_group = 4;
    c.n_shared_experts = 2;
    c.max_position_embeddings = 4096;
  } else {
    return invalid_argument("mkmodel: unknown preset \"{}\" (expected \"tiny\" or \"bench-2.6b\")",
                            o.preset);
  }
  if (o.dtype == "fp8") {
    c.fp8 = Fp8Quantization{kBlock, kBlock};
  } else if (o.dtype != "bf16" && o.dtype != "f16") {
    return invalid_argument("mkmodel: unknown dtype \"{}\" (expected \"bf16\", \"f16\" or \"fp8\")",
                            o.dtype);
  }
  if (o.shards < 1) return invalid_argument("mkmodel: shards must be >= 1, got {}", o.shards);
  if (!o.router_skew.empty()) XDS_RETURN_IF_ERROR(parse_router_skew(o.router_skew).status());
  if (o.max_position_embeddings.has_value()) {
    const int64_t n = *o.max_position_embeddings;
    if (n < 1) {
      return invalid_argument("mkmodel: --max-position-embeddings must be >= 1, got {}", n);
    }
    c.max_position_embeddings = n;
  }
  c.moe_layer_freq = 1;
  c.routed_scaling_factor = 2.5;
  c.norm_topk_prob = true;
  c.scoring_func = GatingScore::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  if (!o.q_lora) c.q_lora_rank.reset();
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  XDS_ASSIGN_OR_RETURN(c.family, family_of(o.arch));
  XDS_RETURN_IF_ERROR(apply_family(o, c));
  if (o.yarn && c.family != DeepseekFamily::kKimiK2) {
    // max_position_embeddings = factor · original_max_position_embeddings, as published.
    constexpr int64_t kYarnFactor = 4;
    if (c.max_position_embeddings % kYarnFactor != 0) {
      return invalid_argument(
          "mkmodel: --max-position-embeddings {} with --yarn must be a multiple of the yarn "
          "factor {} (original_max_position_embeddings = max_position_embeddings / {})",
          c.max_position_embeddings, kYarnFactor, kYarnFactor);
    }
    RopeScaling r;
    r.factor = static_cast<double>(kYarnFactor);
    r.original_max_position_embeddings = c.max_position_embeddings / kYarnFactor;
    r.beta_fast = 32.0;
    r.beta_slow = 1.0;
    r.mscale = c.family == DeepseekFamily::kDeepseekV2 ? 0.707 : 1.0;  // as V2 publishes
    r.mscale_all_dim = r.mscale;
    c.rope_scaling = r;
  }
  c.tie_word_embeddings = false;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
  return c;
}

}  // namespace xds

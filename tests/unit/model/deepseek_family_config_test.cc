// The published config.json files of the other members of the DeepSeek module family — Kimi K2
// (model_type kimi_k2) and DeepSeek-V2 / V2-Lite (deepseek_v2) — read into DeepseekV3Config
// with the meaning their modeling code gives each field. The texts are the published files'
// fields (Hugging Face moonshotai/Kimi-K2-Instruct, deepseek-ai/DeepSeek-V2-Lite and
// deepseek-ai/DeepSeek-V2), auto_map left out.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "model/deepseek_v3/config.h"

namespace xds {
namespace {

using json = nlohmann::json;

constexpr const char* kKimiK2 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 163584, "eos_token_id": 163585, "ep_size": 1,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 131072, "model_type": "kimi_k2", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 64, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 64, "num_nextn_predict_layers": 0,
  "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.48.3", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 163840
})";

constexpr const char* kDeepseekV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
  "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
  "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400
})";

// DeepSeek-V2 (236B): V2-Lite's layout with these fields changed.
json deepseek_v2() {
  json j = json::parse(kDeepseekV2Lite);
  j.update(json::parse(R"({
    "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_routed_experts": 160, "n_group": 8, "topk_group": 3, "q_lora_rank": 1536,
    "routed_scaling_factor": 16.0, "topk_method": "group_limited_greedy"
  })"));
  return j;
}

Result<DeepseekV3Config> parse(const json& j) {
  return parse_deepseek_v3_config(j.dump(), "c.json");
}

void expect_error(const json& j, std::initializer_list<std::string> parts) {
  auto r = parse(j);
  ASSERT_FALSE(r.ok()) << j.dump();
  for (const auto& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "missing '" << p << "' in: " << r.status().message();
  }
}

TEST(FamilyConfig, KimiK2IsTheDeepseekV3Computation) {
  auto r = parse(json::parse(kKimiK2));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const DeepseekV3Config& c = *r;
  EXPECT_EQ(c.family, DeepseekFamily::kKimiK2);
  EXPECT_STREQ(deepseek_model_type(c.family), "kimi_k2");
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.num_attention_heads, 64);
  ASSERT_TRUE(c.q_lora_rank.has_value());
  EXPECT_EQ(*c.q_lora_rank, 1536);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_fast, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_EQ(c.fp8->block_rows, 128);
  ASSERT_EQ(c.eos_token_ids.size(), 1u);
  EXPECT_EQ(c.eos_token_ids[0], 163585);
  const GatingParams g = gating_params(c);
  EXPECT_EQ(g.score, GatingScore::kSigmoid);
  EXPECT_EQ(g.method, TopkMethod::kNoauxTc);
  EXPECT_TRUE(g.norm_topk_prob);
  EXPECT_DOUBLE_EQ(g.routed_scaling_factor, 2.827);
  EXPECT_EQ(g.scaling, RoutedScaling::kAlways);  // normalised, then × 2.827 (V3's gate)
}

TEST(FamilyConfig, DeepseekV2LiteHasNoQLoraAndGreedySoftmaxRouting) {
  auto r = parse(json::parse(kDeepseekV2Lite));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const DeepseekV3Config& c = *r;
  EXPECT_EQ(c.family, DeepseekFamily::kDeepseekV2);
  EXPECT_STREQ(deepseek_model_type(c.family), "deepseek_v2");
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale, 0.707);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale_all_dim, 0.707);
  const GatingParams g = gating_params(c);
  EXPECT_EQ(g.score, GatingScore::kSoftmax);
  EXPECT_EQ(g.method, TopkMethod::kGreedy);
  EXPECT_FALSE(g.norm_topk_prob);
  EXPECT_DOUBLE_EQ(g.routed_scaling_factor, 1.0);
  EXPECT_EQ(g.scaling, RoutedScaling::kUnnormalizedOnly);
}

TEST(FamilyConfig, DeepseekV2GroupLimitedGreedyScaledBy16) {
  auto r = parse(deepseek_v2());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const GatingParams g = gating_params(*r);
  EXPECT_EQ(r->family, DeepseekFamily::kDeepseekV2);
  EXPECT_EQ(*r->q_lora_rank, 1536);
  EXPECT_EQ(g.method, TopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ(g.num_experts, 160);
  EXPECT_EQ(g.top_k, 6);
  EXPECT_EQ(g.n_group, 8);
  EXPECT_EQ(g.topk_group, 3);
  EXPECT_DOUBLE_EQ(g.routed_scaling_factor, 16.0);
  EXPECT_FALSE(g.norm_topk_prob);
}

// Fields a DeepSeek-V2 config may leave out take DeepseekV2Config's defaults, not V3's.
TEST(FamilyConfig, DeepseekV2DefaultsAreItsOwn) {
  json j = json::parse(kDeepseekV2Lite);
  j.erase("scoring_func");
  j.erase("topk_method");
  j.erase("norm_topk_prob");
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->scoring_func, GatingScore::kSoftmax);
  EXPECT_EQ(r->topk_method, TopkMethod::kGreedy);
  EXPECT_FALSE(r->norm_topk_prob);
  // Without model_type, the architecture picks the family.
  j.erase("model_type");
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->family, DeepseekFamily::kDeepseekV2);
}

TEST(FamilyConfig, DeepseekV2RejectsWhatItsGateDoesNotCompute) {
  json j = json::parse(kDeepseekV2Lite);
  j["scoring_func"] = "sigmoid";
  expect_error(j, {"field 'scoring_func'", "\"softmax\"", "deepseek_v2"});
  j = json::parse(kDeepseekV2Lite);
  j["topk_method"] = "noaux_tc";
  expect_error(j, {"field 'topk_method'", "group_limited_greedy", "\"noaux_tc\""});
  j = json::parse(kDeepseekV2Lite);
  j["num_nextn_predict_layers"] = 1;
  expect_error(j, {"field 'num_nextn_predict_layers'", "no MTP layers", "found 1"});
  // group_limited_greedy cannot choose more experts than the kept groups hold.
  j = deepseek_v2();
  j["topk_group"] = 1;  // 20 experts per group
  j["num_experts_per_tok"] = 21;
  expect_error(j, {"field 'num_experts_per_tok'", "topk_group"});
}

TEST(FamilyConfig, ModelTypeAndArchitectureMustAgree) {
  json j = json::parse(kDeepseekV2Lite);
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  expect_error(j, {"field 'architectures'", "DeepseekV2ForCausalLM", "model_type deepseek_v2",
                   "DeepseekV3ForCausalLM"});
  j = json::parse(kKimiK2);
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  expect_error(j, {"field 'architectures'", "DeepseekV3ForCausalLM", "model_type kimi_k2"});
}

}  // namespace
}  // namespace xds

// GLM-4.5 config.json parsing: the published fields, transformers' defaults, the derived
// rotary dims, gating and dense/MoE layers, and a clear error naming the field for what is
// missing, invalid or unsupported.
#include "model/glm4_moe/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace xds {
namespace {

using json = nlohmann::json;

// zai-org/GLM-4.5's config.json as published (the fields that matter).
json published() {
  return json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "partial_rotary_factor": 0.5,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1536, "norm_topk_prob": true,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 160,
    "n_shared_experts": 1, "routed_scaling_factor": 2.5, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "num_hidden_layers": 92, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": true, "use_qk_norm": true,
    "vocab_size": 151552})");
}

Result<Glm4MoeConfig> parse(const json& j) {
  return parse_glm4_moe_config(j.dump(), "c.json");
}

std::string error_of(const json& j) {
  auto r = parse(j);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : std::string(r.status().message());
}

TEST(Glm4Config, PublishedConfigParses) {
  auto r = parse(published());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Glm4MoeConfig& c = *r;
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // not 5120 / 96
  EXPECT_EQ(c.group_size(), 12);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.use_qk_norm);
  EXPECT_EQ(c.n_routed_experts, 160);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151329, 151336, 151338}));
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(92));  // the MTP layer
  const GatingParams g = gating_params(c);
  EXPECT_EQ(g.score, GatingScore::kSigmoid);
  EXPECT_EQ(g.method, TopkMethod::kNoauxTc);
  EXPECT_EQ(g.scaling, RoutedScaling::kAlways);
  EXPECT_DOUBLE_EQ(g.routed_scaling_factor, 2.5);
  EXPECT_TRUE(g.norm_topk_prob);
  const RopeParams rp = rope_params(c);
  EXPECT_EQ(rp.dim, 64);
  EXPECT_EQ(rp.qk_head_dim, 128);
  EXPECT_DOUBLE_EQ(rp.theta, 1e6);
  EXPECT_FALSE(rp.scaling.has_value());
}

TEST(Glm4Config, TransformersDefaults) {
  json j = published();
  for (const char* key :
       {"head_dim", "partial_rotary_factor", "attention_bias", "use_qk_norm", "n_shared_experts",
        "first_k_dense_replace", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
        "num_nextn_predict_layers", "tie_word_embeddings"})
    j.erase(key);
  j["num_attention_heads"] = 40;  // 5120 / 40 = 128
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_DOUBLE_EQ(r->partial_rotary_factor, 0.5);
  EXPECT_FALSE(r->attention_bias);
  EXPECT_FALSE(r->use_qk_norm);
  EXPECT_EQ(r->n_shared_experts, 1);
  EXPECT_EQ(r->first_k_dense_replace, 1);
  EXPECT_EQ(r->n_group, 1);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_DOUBLE_EQ(r->routed_scaling_factor, 1.0);
  EXPECT_EQ(r->num_nextn_predict_layers, 0);
  EXPECT_FALSE(r->tie_word_embeddings);
}

TEST(Glm4Config, ErrorsNameTheField) {
  json j = published();
  j.erase("n_routed_experts");
  EXPECT_NE(error_of(j).find("'n_routed_experts': required"), std::string::npos);
  j = published();
  j["model_type"] = "glm4";
  EXPECT_NE(error_of(j).find("'model_type': expected \"glm4_moe\""), std::string::npos);
  j = published();
  j["partial_rotary_factor"] = 1.5;
  EXPECT_NE(error_of(j).find("'partial_rotary_factor': expected a number in (0, 1]"),
            std::string::npos);
  j = published();
  j["partial_rotary_factor"] = 0.01;  // 128 · 0.01 -> 1 dim
  EXPECT_NE(error_of(j).find("'partial_rotary_factor'"), std::string::npos);
  j = published();
  j["num_key_value_heads"] = 7;
  EXPECT_NE(error_of(j).find("'num_key_value_heads': expected a divisor"), std::string::npos);
  j = published();
  j["n_group"] = 3;
  EXPECT_NE(error_of(j).find("'n_group': expected a divisor of n_routed_experts"),
            std::string::npos);
  j = published();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("'rope_scaling': expected null"), std::string::npos);
  j = published();
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of(j).find("'hidden_act'"), std::string::npos);
  j = published();
  j["use_qk_norm"] = "yes";
  EXPECT_NE(error_of(j).find("'use_qk_norm': expected true or false"), std::string::npos);
  j = published();
  j["eos_token_id"] = 200000;
  EXPECT_NE(error_of(j).find("eos_token_id"), std::string::npos);
}

}  // namespace
}  // namespace xds

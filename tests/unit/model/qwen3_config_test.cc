// Qwen3-MoE config.json parsing: the published fields, transformers' defaults and sparse-layer
// rule, and a clear error naming the field for what is missing, invalid or unsupported.
#include "model/qwen3_moe/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace xds {
namespace {

using json = nlohmann::json;

// Qwen3-30B-A3B's config.json as published (the fields that matter), smaller in layers.
json published() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

Result<Qwen3MoeConfig> parse(const json& j) {
  return parse_qwen3_moe_config(j.dump(), "c.json");
}

// The error of parsing `j`, which must fail.
std::string error_of(const json& j) {
  auto r = parse(j);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : std::string(r.status().message());
}

TEST(Qwen3Config, PublishedConfigParses) {
  auto r = parse(published());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Qwen3MoeConfig& c = *r;
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);  // not 2048 / 32 = 64
  EXPECT_EQ(c.group_size(), 8);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  for (int64_t l = 0; l < 48; ++l) EXPECT_TRUE(c.is_moe_layer(l));
  const GatingParams g = gating_params(c);
  EXPECT_EQ(g.score, GatingScore::kSoftmax);
  EXPECT_EQ(g.method, TopkMethod::kGreedy);
  EXPECT_TRUE(g.norm_topk_prob);
  EXPECT_EQ(g.routed_scaling_factor, 1.0);
}

TEST(Qwen3Config, DefaultsAsTransformers) {
  json j = published();
  for (const char* k : {"head_dim", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                        "tie_word_embeddings"})
    j.erase(k);
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->head_dim, 64);  // hidden_size / num_attention_heads
  EXPECT_FALSE(r->norm_topk_prob);
  EXPECT_EQ(r->decoder_sparse_step, 1);
  EXPECT_FALSE(r->tie_word_embeddings);
}

TEST(Qwen3Config, SparseStepAndMlpOnlyLayers) {
  json j = published();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3, 4};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  // (l + 1) % 2 == 0 -> 1, 3, 5; minus layer 3 (dense by list).
  const bool want[] = {false, true, false, false, false, true};
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(r->is_moe_layer(l), want[l]) << "layer " << l;
}

TEST(Qwen3Config, YarnRopeScaling) {
  json j = published();
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->rope_scaling.has_value());
  EXPECT_EQ(r->rope_scaling->factor, 4.0);
  EXPECT_EQ(r->rope_scaling->original_max_position_embeddings, 32768);
  j["rope_scaling"].erase("original_max_position_embeddings");
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling->original_max_position_embeddings, 40960);
}

TEST(Qwen3Config, ErrorsNameTheField) {
  struct Case {
    const char* key;
    json value;  // null: erase the key
    const char* expect;
  };
  const Case cases[] = {
      {"num_key_value_heads", nullptr, "'num_key_value_heads': required but missing"},
      {"num_key_value_heads", 5, "'num_key_value_heads': expected a divisor of"},
      {"head_dim", 127, "'head_dim': expected an even number"},
      {"num_experts_per_tok", 129, "'num_experts_per_tok': expected <= num_experts"},
      {"mlp_only_layers", json::array({48}), "'mlp_only_layers': expected layer indices <"},
      {"mlp_only_layers", "all", "'mlp_only_layers': expected a list"},
      {"decoder_sparse_step", 0, "'decoder_sparse_step'"},
      {"norm_topk_prob", "yes", "'norm_topk_prob': expected true or false"},
      {"use_sliding_window", true, "'use_sliding_window': expected false"},
      {"attention_bias", true, "'attention_bias': expected false"},
      {"hidden_act", "gelu", "'hidden_act': expected \"silu\""},
      {"model_type", "qwen2_moe", "'model_type': expected \"qwen3_moe\""},
      {"rope_scaling", json{{"rope_type", "linear"}, {"factor", 2.0}}, "'rope_scaling.rope_type'"},
      {"quantization_config", json{{"quant_method", "fp8"}}, "'quantization_config'"},
      {"eos_token_id", 151936, "'eos_token_id': expected ids < vocab_size"},
      {"vocab_size", -1, "'vocab_size'"},
  };
  for (const Case& c : cases) {
    json j = published();
    if (c.value.is_null()) {
      j.erase(c.key);
    } else {
      j[c.key] = c.value;
    }
    const std::string e = error_of(j);
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.key << ": " << e;
    EXPECT_NE(e.find("c.json"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace xds

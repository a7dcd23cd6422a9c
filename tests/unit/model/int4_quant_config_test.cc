// quantization_config of 4-bit checkpoints (model/quant_config.h, layouts 2 and 3): the
// compressed-tensors pack-quantized configs llm-compressor writes (W4A16 sym / asym,
// actorder, W4A8) and GPTQ's as transformers writes it are read into one IntQuantization;
// every value we cannot run fails with an error naming its field.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "model/deepseek_v3/config.h"
#include "model/quant_config.h"

namespace xds {
namespace {

using json = nlohmann::json;

json model_with(const json& q) {
  json c = json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "n_shared_experts": 1, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4,
    "topk_group": 2, "first_k_dense_replace": 1, "q_lora_rank": 128, "kv_lora_rank": 96,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32})");
  c["quantization_config"] = q;
  return c;
}

// As llm-compressor writes a W4A16 group-128 asymmetric scheme.
json pack_quantized() {
  return json::parse(R"({
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "quantization_status": "compressed", "global_compression_ratio": null,
    "config_groups": {"group_0": {
      "targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "int", "symmetric": false, "group_size": 128,
                  "strategy": "group", "block_structure": null, "dynamic": false,
                  "actorder": null, "observer": "minmax", "observer_kwargs": {}},
      "input_activations": null, "output_activations": null}},
    "ignore": ["lm_head", "re:.*mlp\\.gate$"],
    "kv_cache_scheme": null, "sparsity_config": {}})");
}

json gptq() {
  return json::parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": false, "sym": true, "damp_percent": 0.01, "true_sequential": true,
    "static_groups": false, "use_exllama": true, "modules_in_block_to_quantize": null})");
}

Result<DeepseekV3Config> parse(const json& q) {
  return parse_deepseek_v3_config(model_with(q).dump(), "m/config.json");
}

TEST(Int4QuantConfig, AcceptsPackQuantizedW4A16) {
  auto c = parse(pack_quantized());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(c->int_quant.has_value());
  const IntQuantization& q = *c->int_quant;
  EXPECT_EQ(q.scheme, IntScheme::kW4A16);
  EXPECT_EQ(q.format, Int4Format::kPackQuantized);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_FALSE(q.symmetric);
  EXPECT_EQ(q.actorder, Int4ActOrder::kNone);
  EXPECT_FALSE(q.quantizes("lm_head"));
  EXPECT_FALSE(q.quantizes("model.layers.1.mlp.gate"));
  EXPECT_TRUE(q.quantizes("model.layers.1.mlp.experts.0.up_proj"));
}

TEST(Int4QuantConfig, AcceptsActorderSymmetricAndW4A8) {
  json j = pack_quantized();
  json& w = j["config_groups"]["group_0"]["weights"];
  w["symmetric"] = true;
  w["group_size"] = 32;
  for (const char* a : {"group", "weight"}) {
    w["actorder"] = a;
    auto c = parse(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_TRUE(c->int_quant->symmetric);
    EXPECT_EQ(c->int_quant->actorder,
              std::string(a) == "group" ? Int4ActOrder::kGroup : Int4ActOrder::kWeight);
  }
  j["config_groups"]["group_0"]["input_activations"] = json::parse(R"({"num_bits": 8,
    "type": "int", "symmetric": true, "group_size": null, "strategy": "token",
    "block_structure": null, "dynamic": true, "actorder": null})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->int_quant->scheme, IntScheme::kW4A8);
  EXPECT_EQ(c->int_quant->group_size, 32);
}

TEST(Int4QuantConfig, AcceptsGptq) {
  auto c = parse(gptq());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const IntQuantization& q = *c->int_quant;
  EXPECT_EQ(q.scheme, IntScheme::kW4A16);
  EXPECT_EQ(q.format, Int4Format::kGptq);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_TRUE(q.symmetric);
  EXPECT_TRUE(q.gptq_zero_minus_one);  // v1, the default
  EXPECT_TRUE(q.quantized_by_tensors);
  json v2 = gptq();
  v2["checkpoint_format"] = "gptq_v2";
  v2["sym"] = false;
  v2["desc_act"] = true;
  c = parse(v2);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->int_quant->gptq_zero_minus_one);
  EXPECT_FALSE(c->int_quant->symmetric);
  EXPECT_EQ(c->int_quant->actorder, Int4ActOrder::kGroup);
}

// The writers' configs read back as what they describe.
TEST(Int4QuantConfig, WrittenConfigsReadBack) {
  auto c = parse(json::parse(w4_pack_quantized_json(64, false, true, {"lm_head"}).dump()));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->int_quant->scheme, IntScheme::kW4A8);
  EXPECT_EQ(c->int_quant->group_size, 64);
  EXPECT_FALSE(c->int_quant->symmetric);
  c = parse(json::parse(w4_gptq_json(32, true).dump()));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->int_quant->format, Int4Format::kGptq);
  EXPECT_EQ(c->int_quant->group_size, 32);
}

TEST(Int4QuantConfig, UnsupportedValuesNameTheirField) {
  struct Case {
    json config;
    std::string field;
  };
  std::vector<Case> cases;
  auto weights_with = [](const char* f, const json& v) {
    json j = pack_quantized();
    j["config_groups"]["group_0"]["weights"][f] = v;
    return j;
  };
  const std::string w = "quantization_config.config_groups.group_0.weights.";
  cases.push_back({weights_with("num_bits", 3), w + "num_bits"});
  cases.push_back({weights_with("num_bits", 8), w + "num_bits"});
  cases.push_back({weights_with("type", "float"), w + "type"});
  cases.push_back({weights_with("strategy", "channel"), w + "strategy"});
  cases.push_back({weights_with("group_size", 48), w + "group_size"});
  cases.push_back({weights_with("group_size", nullptr), w + "group_size"});
  cases.push_back({weights_with("actorder", "dynamic"), w + "actorder"});
  cases.push_back({weights_with("symmetric", "yes"), w + "symmetric"});
  cases.push_back({weights_with("dynamic", true), w + "dynamic"});
  {
    json j = pack_quantized();
    j["config_groups"]["group_0"]["input_activations"] =
        json::parse(R"({"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": true})");
    cases.push_back({j, "quantization_config.config_groups.group_0.input_activations.strategy"});
  }
  {
    json j = pack_quantized();
    j["format"] = "marlin-24";
    cases.push_back({j, "quantization_config.format"});
  }
  {
    json j = pack_quantized();
    j["quant_method"] = "awq";
    cases.push_back({j, "quantization_config.quant_method"});
  }
  {
    json j = pack_quantized();
    j["quant_method"] = "gguf";
    cases.push_back({j, "quantization_config.quant_method"});
  }
  auto gptq_with = [](const char* f, const json& v) {
    json j = gptq();
    j[f] = v;
    return j;
  };
  cases.push_back({gptq_with("bits", 8), "quantization_config.bits"});
  cases.push_back({gptq_with("bits", 3), "quantization_config.bits"});
  cases.push_back({gptq_with("group_size", -1), "quantization_config.group_size"});
  cases.push_back({gptq_with("sym", "true"), "quantization_config.sym"});
  cases.push_back({gptq_with("desc_act", 1), "quantization_config.desc_act"});
  cases.push_back(
      {gptq_with("checkpoint_format", "marlin"), "quantization_config.checkpoint_format"});
  for (const Case& c : cases) {
    auto r = parse(c.config);
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_NE(r.status().message().find("m/config.json"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("'" + c.field + "'"), std::string::npos)
        << c.field << ": " << r.status().message();
  }
}

}  // namespace
}  // namespace xds

// quantization_config of compressed-tensors W8A8 checkpoints (model/quant_config.h): the
// published layout is accepted, and each field outside the one supported scheme is refused
// with an error naming that field.
#include "model/quant_config.h"

#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/deepseek_v3/config.h"

namespace xds {
namespace {

using json = nlohmann::json;

// A DeepSeek-V3 config.json with the W8A8 quantization_config as llm-compressor writes it.
json w8a8_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "n_shared_experts": 1, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4,
    "topk_group": 2, "first_k_dense_replace": 1, "q_lora_rank": 128, "kv_lora_rank": 96,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "quantization_config": {
      "quant_method": "compressed-tensors", "format": "int-quantized",
      "quantization_status": "compressed", "global_compression_ratio": null,
      "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": true, "group_size": null,
                    "strategy": "channel", "block_structure": null, "dynamic": false,
                    "actorder": null, "observer": "minmax", "observer_kwargs": {}},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": true,
                              "group_size": null, "strategy": "token", "block_structure": null,
                              "dynamic": true, "actorder": null, "observer": null,
                              "observer_kwargs": {}},
        "output_activations": null}},
      "ignore": ["lm_head", "re:.*mlp\\.gate$", "re:.*kv_b_proj$",
                 "model.layers.0.self_attn.o_proj"],
      "kv_cache_scheme": null, "sparsity_config": {}
    }
  })");
}

Result<DeepseekV3Config> parse(const json& j) {
  return parse_deepseek_v3_config(j.dump(), "m/config.json");
}

TEST(QuantConfig, AcceptsThePublishedW8A8Layout) {
  Result<DeepseekV3Config> c = parse(w8a8_config());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(c->int_quant.has_value());
  EXPECT_FALSE(c->fp8.has_value());
  const IntQuantization& q = *c->int_quant;
  EXPECT_EQ(q.ignore_names,
            (std::vector<std::string>{"lm_head", "model.layers.0.self_attn.o_proj"}));
  ASSERT_EQ(q.ignore_patterns.size(), 2u);
  // Exact names, and regexes anchored at the start (re.match), not at the end.
  EXPECT_FALSE(q.quantizes("lm_head"));
  EXPECT_FALSE(q.quantizes("model.layers.3.mlp.gate"));
  EXPECT_TRUE(q.quantizes("model.layers.3.mlp.gate_proj"));
  EXPECT_TRUE(q.quantizes("model.layers.3.mlp.experts.7.gate_proj"));
  EXPECT_FALSE(q.quantizes("model.layers.2.self_attn.kv_b_proj"));
  EXPECT_TRUE(q.quantizes("model.layers.2.self_attn.kv_a_proj_with_mqa"));
  EXPECT_FALSE(q.quantizes("model.layers.0.self_attn.o_proj"));
  EXPECT_TRUE(q.quantizes("model.layers.1.self_attn.o_proj"));
  EXPECT_TRUE(q.quantizes("xlm_head"));  // exact names only
}

TEST(QuantConfig, OptionalFieldsMayBeAbsent) {
  json j = w8a8_config();
  json& qc = j["quantization_config"];
  for (const char* f : {"quantization_status", "kv_cache_scheme", "sparsity_config", "ignore"})
    qc.erase(f);
  json& w = qc["config_groups"]["group_0"]["weights"];
  for (const char* f : {"symmetric", "group_size", "block_structure", "dynamic", "actorder"})
    w.erase(f);
  qc["config_groups"]["group_0"].erase("output_activations");
  Result<DeepseekV3Config> c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->int_quant->quantizes("lm_head"));  // no ignore list: every Linear
}

TEST(QuantConfig, WrittenConfigReadsBack) {
  json j = w8a8_config();
  j["quantization_config"] =
      json::parse(w8a8_quantization_json({"lm_head", "re:.*mlp\\.gate$"}).dump());
  Result<DeepseekV3Config> c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->int_quant->quantizes("model.layers.1.mlp.gate"));
  EXPECT_TRUE(c->int_quant->quantizes("model.layers.1.mlp.up_proj"));
}

struct BadField {
  const char* pointer;  // JSON pointer under quantization_config
  json value;           // set there (null with erase: removed)
  bool erase;
  const char* field;  // the field path the error must name
};

TEST(QuantConfig, EachUnsupportedFieldIsNamed) {
  const BadField cases[] = {
      {"/quant_method", "awq", false, "quantization_config.quant_method"},
      {"/format", "float-quantized", false, "quantization_config.format"},
      {"/format", nullptr, true, "quantization_config.format"},
      {"/quantization_status", "frozen", false, "quantization_config.quantization_status"},
      {"/kv_cache_scheme", json{{"num_bits", 8}}, false, "quantization_config.kv_cache_scheme"},
      {"/sparsity_config", json{{"format", "sparse-24-bitmask"}}, false,
       "quantization_config.sparsity_config"},
      {"/config_groups/group_1", json::object(), false, "quantization_config.config_groups"},
      {"/config_groups", nullptr, true, "quantization_config.config_groups"},
      {"/ignore", "lm_head", false, "quantization_config.ignore"},
      {"/ignore/1", "re:([", false, "quantization_config.ignore[1]"},
      {"/ignore/0", 3, false, "quantization_config.ignore[0]"}};
  for (const BadField& b : cases) {
    json j = w8a8_config();
    json& qc = j["quantization_config"];
    if (b.erase) {
      qc.at(json::json_pointer(b.pointer).parent_pointer())
          .erase(json::json_pointer(b.pointer).back());
    } else {
      qc[json::json_pointer(b.pointer)] = b.value;
    }
    Result<DeepseekV3Config> c = parse(j);
    ASSERT_FALSE(c.ok()) << b.pointer;
    EXPECT_NE(c.status().message().find(fmt::format("field '{}'", b.field)), std::string::npos)
        << b.pointer << ": " << c.status().message();
    EXPECT_NE(c.status().message().find("m/config.json"), std::string::npos);
  }
}

TEST(QuantConfig, EachUnsupportedSchemeFieldIsNamed) {
  const std::string g = "quantization_config.config_groups.group_0";
  const struct {
    const char* part;  // weights | input_activations | the group itself ("")
    const char* key;
    json value;
    bool erase;
  } cases[] = {
      {"", "targets", json{"Linear", "Embedding"}, false},
      {"", "targets", nullptr, true},
      {"", "output_activations", json{{"num_bits", 8}}, false},
      {"", "input_activations", nullptr, true},  // W8A16 (weight-only) is not W8A8
      {"", "weights", nullptr, true},
      {"weights", "num_bits", 4, false},
      {"weights", "type", "float", false},
      {"weights", "symmetric", false, false},
      {"weights", "strategy", "group", false},
      {"weights", "strategy", "tensor", false},
      {"weights", "strategy", "block", false},
      {"weights", "group_size", 128, false},
      {"weights", "block_structure", json{128, 128}, false},
      {"weights", "dynamic", true, false},
      {"weights", "actorder", "group", false},
      {"input_activations", "num_bits", 4, false},
      {"input_activations", "type", "float", false},
      {"input_activations", "symmetric", false, false},
      {"input_activations", "strategy", "tensor", false},
      {"input_activations", "dynamic", false, false},  // static activation scales
      {"input_activations", "dynamic", nullptr, true},
      {"input_activations", "group_size", 128, false},
  };
  for (const auto& b : cases) {
    json j = w8a8_config();
    json& group = j["quantization_config"]["config_groups"]["group_0"];
    json& obj = std::string(b.part).empty() ? group : group[b.part];
    if (b.erase) {
      obj.erase(b.key);
    } else {
      obj[b.key] = b.value;
    }
    const std::string field = std::string(b.part).empty()
                                  ? fmt::format("{}.{}", g, b.key)
                                  : fmt::format("{}.{}.{}", g, b.part, b.key);
    Result<DeepseekV3Config> c = parse(j);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(fmt::format("field '{}'", field)), std::string::npos)
        << field << ": " << c.status().message();
  }
}

}  // namespace
}  // namespace xds

// quantization_config of 4-bit checkpoints whose lm_head and kv_b_proj are int8
// (model/quant_config.h layout 2b): compressed-tensors "mixed-precision" with a 4-bit group
// targeting "Linear" and a W8A8 group targeting those modules by name and regex, written here
// by hand as llm-compressor writes such configs. Each module takes the group of its most
// specific target (exact names, then "re:" patterns, then class names, as compressed-tensors
// resolves them), whatever the order of the groups; `ignore` wins over both; every other mix
// fails naming its field; the single-group configs read as before.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// A W4A16 group-64 symmetric scheme for Linear with an int8 head and kv_b_proj group.
json mixed() {
  return json::parse(R"({
    "quant_method": "compressed-tensors", "format": "mixed-precision",
    "quantization_status": "compressed", "global_compression_ratio": null,
    "config_groups": {
      "group_0": {
        "targets": ["Linear"], "format": "pack-quantized",
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "group_size": 64,
                    "strategy": "group", "block_structure": null, "dynamic": false,
                    "actorder": null, "observer": "minmax", "observer_kwargs": {}},
        "input_activations": null, "output_activations": null},
      "group_1": {
        "targets": ["lm_head", "re:.*kv_b_proj$"], "format": "int-quantized",
        "weights": {"num_bits": 8, "type": "int", "symmetric": true, "group_size": null,
                    "strategy": "channel", "block_structure": null, "dynamic": false,
                    "actorder": null, "observer": "minmax", "observer_kwargs": {}},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": true,
                              "group_size": null, "strategy": "token",
                              "block_structure": null, "dynamic": true, "actorder": null,
                              "observer": null, "observer_kwargs": {}},
        "output_activations": null}},
    "ignore": ["re:.*mlp\\.gate$", "model.layers.1.self_attn.kv_b_proj"],
    "kv_cache_scheme": null, "sparsity_config": {}})");
}

Result<DeepseekV3Config> parse(const json& q) {
  return parse_deepseek_v3_config(model_with(q).dump(), "m/config.json");
}

// What the config says of each module, hand-derived from mixed(): lm_head and kv_b_proj
// int8 (named before the class target), layer 1's kv_b_proj ignored, the rest 4-bit.
void expect_mixed_modules(const IntQuantization& q, IntScheme w4) {
  EXPECT_EQ(q.scheme, w4);
  EXPECT_EQ(q.format, Int4Format::kPackQuantized);
  EXPECT_EQ(q.group_size, 64);
  EXPECT_TRUE(q.symmetric);
  EXPECT_EQ(q.scheme_of("lm_head"), IntScheme::kW8A8);
  EXPECT_TRUE(q.int8_module("lm_head"));
  EXPECT_EQ(q.scheme_of("model.layers.0.self_attn.kv_b_proj"), IntScheme::kW8A8);
  EXPECT_TRUE(q.int8_module("model.layers.2.self_attn.kv_b_proj"));
  // `ignore` wins over the int8 group.
  EXPECT_FALSE(q.quantizes("model.layers.1.self_attn.kv_b_proj"));
  EXPECT_FALSE(q.int8_module("model.layers.1.self_attn.kv_b_proj"));
  // Not targeted by name: the Linear group. The regex ends at "$" (kv_b_proj_x is not it);
  // exact names only ("xlm_head", "lm_head.x" are not lm_head).
  for (const char* m : {"model.layers.0.self_attn.q_a_proj", "model.layers.2.mlp.experts.3.up_proj",
                        "model.layers.0.self_attn.kv_b_proj_x", "xlm_head", "lm_head.x",
                        "model.layers.3.shared_head.head"}) {
    EXPECT_EQ(q.scheme_of(m), w4) << m;
    EXPECT_FALSE(q.int8_module(m)) << m;
    EXPECT_TRUE(q.quantizes(m)) << m;
  }
  EXPECT_FALSE(q.quantizes("model.layers.2.mlp.gate"));
}

TEST(Int4Int8HeadConfig, MixedPrecisionNamesTheInt8Modules) {
  auto c = parse(mixed());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_mixed_modules(*c->int_quant, IntScheme::kW4A16);
}

TEST(Int4Int8HeadConfig, NamedTargetsWinWhateverTheGroupOrder) {
  json j = mixed();
  json groups = json::object();
  groups["a_int8"] = j["config_groups"]["group_1"];
  groups["b_w4"] = j["config_groups"]["group_0"];
  // W4A8: int8 activations in the Linear group too.
  groups["b_w4"]["input_activations"] = groups["a_int8"]["input_activations"];
  j["config_groups"] = groups;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_mixed_modules(*c->int_quant, IntScheme::kW4A8);
}

TEST(Int4Int8HeadConfig, SingleGroupConfigsHaveNoInt8Modules) {
  json j = mixed();
  j["format"] = "pack-quantized";
  j["config_groups"].erase("group_1");
  j["config_groups"]["group_0"].erase("format");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->int_quant->scheme_of("lm_head"), IntScheme::kW4A16);
  EXPECT_EQ(c->int_quant->scheme_of("model.layers.0.self_attn.kv_b_proj"), IntScheme::kW4A16);
  EXPECT_TRUE(c->int_quant->int8_target_names.empty());
  // W8A8: every quantized module is int8.
  json w8 = json::parse(w8a8_quantization_json({"re:.*mlp\\.gate$"}).dump());
  c = parse(w8);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->int_quant->scheme_of("model.layers.0.self_attn.q_a_proj"), IntScheme::kW8A8);
  EXPECT_TRUE(c->int_quant->int8_module("lm_head"));
}

TEST(Int4Int8HeadConfig, WrittenConfigReadsBack) {
  const json written = json::parse(
      w4_int8_head_quantization_json(32, false, true, {"re:.*mlp\\.gate$"}).dump());
  EXPECT_EQ(written["format"], "mixed-precision");
  EXPECT_EQ(written["config_groups"]["group_1"]["targets"],
            json::parse(R"(["lm_head", "re:.*kv_b_proj$", "re:.*shared_head\\.head$"])"));
  auto c = parse(written);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const IntQuantization& q = *c->int_quant;
  EXPECT_EQ(q.scheme, IntScheme::kW4A8);
  EXPECT_EQ(q.group_size, 32);
  EXPECT_FALSE(q.symmetric);
  for (const char* m : {"lm_head", "model.layers.0.self_attn.kv_b_proj",
                        "model.layers.3.shared_head.head"}) {
    EXPECT_TRUE(q.int8_module(m)) << m;
  }
  EXPECT_EQ(q.scheme_of("model.layers.3.eh_proj"), IntScheme::kW4A8);
  EXPECT_EQ(q.scheme_of("model.layers.0.self_attn.o_proj"), IntScheme::kW4A8);
}

TEST(Int4Int8HeadConfig, OtherMixesNameTheirField) {
  struct Case {
    json config;
    std::string field;
  };
  std::vector<Case> cases;
  const std::string g = "quantization_config.config_groups";
  auto with = [](const json::json_pointer& p, const json& v) {
    json j = mixed();
    j[p] = v;
    return j;
  };
  using ptr = json::json_pointer;
  // Another module in the int8 group, a duplicate, none, or "Linear" twice.
  cases.push_back({with(ptr("/config_groups/group_1/targets"), json::array({"lm_head", "re:.*o_proj$"})),
                   g + ".group_1.targets[1]"});
  cases.push_back({with(ptr("/config_groups/group_1/targets"), json::array({"lm_head", "lm_head"})),
                   g + ".group_1.targets[1]"});
  cases.push_back({with(ptr("/config_groups/group_1/targets"), json::array()),
                   g + ".group_1.targets"});
  cases.push_back({with(ptr("/config_groups/group_1/targets"), json::array({"Linear"})),
                   g + ".group_1.targets"});
  // A 4-bit head (the named group not W8A8), an 8-bit Linear group.
  cases.push_back({with(ptr("/config_groups/group_1/weights/num_bits"), 4),
                   g + ".group_1.weights.num_bits"});
  cases.push_back({with(ptr("/config_groups/group_1/weights/strategy"), "group"),
                   g + ".group_1.weights.strategy"});
  cases.push_back({with(ptr("/config_groups/group_1/input_activations"), nullptr),
                   g + ".group_1.input_activations"});
  cases.push_back({with(ptr("/config_groups/group_0/weights/num_bits"), 8),
                   g + ".group_0.weights.num_bits"});
  // Per-group formats: the int8 group as int-quantized tensors, the Linear one packed.
  cases.push_back({with(ptr("/config_groups/group_1/format"), "pack-quantized"),
                   g + ".group_1.format"});
  {
    json j = mixed();
    j["config_groups"]["group_1"].erase("format");
    cases.push_back({j, g + ".group_1.format"});
  }
  cases.push_back({with(ptr("/config_groups/group_0/format"), "int-quantized"),
                   g + ".group_0.format"});
  // Two groups need "mixed-precision"; "mixed-precision" needs two.
  cases.push_back({with(ptr("/format"), "pack-quantized"), g});
  {
    json j = mixed();
    j["config_groups"].erase("group_1");
    cases.push_back({j, g});
  }
  {
    json j = mixed();
    j["config_groups"]["group_2"] = j["config_groups"]["group_1"];
    cases.push_back({j, g});
  }
  cases.push_back({with(ptr("/format"), "float-quantized"), "quantization_config.format"});
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

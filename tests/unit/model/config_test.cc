#include "model/deepseek_v3/config.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_files.h"

namespace xds {
namespace {

using json = nlohmann::json;

// A small config in the published DeepSeek-V3 layout (values chosen by hand).
json valid_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 96, "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "routed_scaling_factor": 2.5,
    "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "q_lora_rank": 128, "kv_lora_rank": 96, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "v_head_dim": 32, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "max_position_embeddings": 163840, "hidden_act": "silu", "attention_bias": false,
    "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "torch_dtype": "bfloat16", "use_cache": true
  })");
}

Result<DeepseekV3Config> parse(const json& j) {
  return parse_deepseek_v3_config(j.dump(), "c.json");
}

// Expects an error whose message contains every piece of `parts`.
void expect_error(const json& j, std::initializer_list<std::string> parts) {
  auto r = parse(j);
  ASSERT_FALSE(r.ok()) << j.dump();
  for (const auto& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "missing '" << p << "' in: " << r.status().message();
  }
}

TEST(Config, ParsesPublishedLayout) {
  auto r = parse(valid_config());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const DeepseekV3Config& c = *r;
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.moe_intermediate_size, 96);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.scoring_func, GatingScore::kSigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  ASSERT_TRUE(c.q_lora_rank.has_value());
  EXPECT_EQ(*c.q_lora_rank, 128);
  EXPECT_EQ(c.qk_head_dim(), 48);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale_all_dim, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_EQ(c.fp8->block_rows, 128);
  EXPECT_EQ(c.fp8->block_cols, 128);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(3));  // the MTP layer
}

TEST(Config, NullsAndAbsentOptionals) {
  json j = valid_config();
  j["q_lora_rank"] = nullptr;
  j["rope_scaling"] = nullptr;
  j.erase("quantization_config");
  j.erase("architectures");
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->q_lora_rank.has_value());
  EXPECT_FALSE(r->rope_scaling.has_value());
  EXPECT_FALSE(r->fp8.has_value());
  j.erase("rope_scaling");
  EXPECT_TRUE(parse(j).ok());
  // Newer transformers write "rope_type" instead of "type".
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}};
  auto y = parse(j);
  ASSERT_TRUE(y.ok()) << y.status().to_string();
  EXPECT_DOUBLE_EQ(y->rope_scaling->beta_fast, 32.0);  // default
}

TEST(Config, TypeAndRangeErrorsNameTheField) {
  struct Case {
    const char* key;
    json value;
    std::string found;
  };
  const Case cases[] = {
      {"hidden_size", -3, "-3"},
      {"hidden_size", "256", "\"256\""},
      {"hidden_size", 256.5, "256.5"},
      {"vocab_size", 0, "0"},
      {"num_attention_heads", nullptr, "null"},
      {"kv_lora_rank", true, "true"},
      {"q_lora_rank", 0, "0"},
      {"n_group", 0, "0"},
      {"routed_scaling_factor", -1.0, "-1.0"},
      {"rms_norm_eps", 0, "0"},
      {"norm_topk_prob", 1, "1"},
      {"scoring_func", "tanh", "\"tanh\""},
      {"topk_method", "best", "\"best\""},
      {"hidden_act", "gelu", "\"gelu\""},
      {"attention_bias", true, "true"},
      {"eos_token_id", json::array(), "[]"},
      {"eos_token_id", -1, "-1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    json j = valid_config();
    j[c.key] = c.value;
    expect_error(j, {"c.json", std::string("field '") + c.key + "'", "expected", c.found});
  }
}

TEST(Config, SizesBeyondTheirBoundsAreRefused) {
  // Each bound accepted, one past it refused naming the field. The bounds keep every product
  // the loader forms from sizes inside int64 (config.h).
  struct Case {
    const char* key;
    int64_t bound;
  };
  const Case cases[] = {{"vocab_size", kMaxWidth},
                        {"hidden_size", kMaxWidth},
                        {"intermediate_size", kMaxWidth},
                        {"moe_intermediate_size", kMaxWidth},
                        {"q_lora_rank", kMaxWidth},
                        {"kv_lora_rank", kMaxWidth},
                        {"num_attention_heads", kMaxHeadsOrHeadDim},
                        {"qk_nope_head_dim", kMaxHeadsOrHeadDim},
                        {"qk_rope_head_dim", kMaxHeadsOrHeadDim},
                        {"v_head_dim", kMaxHeadsOrHeadDim},
                        {"num_hidden_layers", kMaxLayers},
                        {"num_nextn_predict_layers", kMaxLayers},
                        {"n_shared_experts", kMaxSharedExperts}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    json j = valid_config();
    j[c.key] = c.bound;
    auto r = parse(j);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    j[c.key] = c.bound + 1;
    expect_error(j, {"c.json", std::string("field '") + c.key + "'", "an integer in [",
                     std::to_string(c.bound + 1)});
  }
}

TEST(Config, SizesWhoseProductsWouldWrapAreRefused) {
  // 4 heads × (qk_nope 2^62 + 32 + rope 16) wraps to 192 = 4 × 48 in int64 arithmetic, and
  // 4 × (2^62 + 32 + v 32) to 256: the shapes of a checkpoint with qk_nope_head_dim 32.
  // Such a config once loaded against that checkpoint and crashed in attention.
  json j = valid_config();
  j["qk_nope_head_dim"] = (int64_t{1} << 62) + 32;
  expect_error(j, {"c.json", "field 'qk_nope_head_dim'", "4611686018427387936"});
  j = valid_config();
  j["q_lora_rank"] = json(uint64_t{1} << 63);
  expect_error(j, {"c.json", "field 'q_lora_rank'", "9223372036854775808"});
}

// Seeded mutations of a valid config.json's text (characters dropped or inserted, digit runs
// replaced by awkward numbers, values swapped for other JSON types): each parse is an error
// naming the file, or a config that keeps the rules the test states here on its own: sizes
// within their bounds, groups dividing the experts, top-k within them, ids in the vocabulary,
// positive finite scales. Under ASan/UBSan a crash or an overflow fails it too.
TEST(Config, TextMutationsGiveAnErrorOrAConsistentConfig) {
  const std::string base = valid_config().dump();
  static const char* kNumbers[] = {"0",
                                   "-1",
                                   "1.5",
                                   "1e308",
                                   "-1e308",
                                   "18446744073709551615",
                                   "18446744073709551616",
                                   "9223372036854775807",
                                   "65537",
                                   "1048577",
                                   "NaN",
                                   "1e-320"};
  static const char* kValues[] = {"null", "true", "[]", "{}", "\"\"", "[1,2]", "\"x\""};
  int accepted = 0;
  for (uint32_t seed = 0; seed < 3000; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
    std::string text = base;
    for (int m = 1 + static_cast<int>(pick(3)); m > 0; --m) {
      switch (pick(3)) {
        case 0:  // a digit run becomes an awkward number
          xds::testing::replace_a_digit_run(text, rng, kNumbers);
          break;
        case 1: {  // a value after a colon becomes another JSON type
          const size_t colon = text.find(':', pick(text.size()));
          if (colon == std::string::npos) break;
          size_t end = colon + 1;
          while (end < text.size() && text[end] != ',' && text[end] != '}') ++end;
          text.replace(colon + 1, end - colon - 1, kValues[pick(std::size(kValues))]);
          break;
        }
        default: {  // a character dropped, or one of the JSON punctuation inserted
          const size_t at = pick(text.size());
          if (pick(2) == 0) {
            text.erase(at, 1);
          } else {
            text.insert(at, 1, "{}[],:\"-"[pick(8)]);
          }
          break;
        }
      }
    }
    auto r = parse_deepseek_v3_config(text, "c.json");
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("c.json"), std::string::npos) << r.status().message();
      continue;
    }
    ++accepted;
    const DeepseekV3Config& c = *r;
    for (const int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size,
                            c.moe_intermediate_size, c.kv_lora_rank}) {
      EXPECT_GE(v, 1);
      EXPECT_LE(v, int64_t{1} << 20);
    }
    for (const int64_t v : {c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
                            c.v_head_dim, c.num_hidden_layers}) {
      EXPECT_GE(v, 1);
      EXPECT_LE(v, int64_t{1} << 16);
    }
    if (c.q_lora_rank) {
      EXPECT_LE(*c.q_lora_rank, int64_t{1} << 20);
    }
    EXPECT_EQ(c.qk_rope_head_dim % 2, 0);
    EXPECT_GE(c.n_group, 1);
    EXPECT_EQ(c.n_routed_experts % c.n_group, 0);
    EXPECT_LE(c.topk_group, c.n_group);
    EXPECT_LE(c.num_experts_per_tok, c.n_routed_experts);
    EXPECT_LE(c.first_k_dense_replace, c.num_hidden_layers);
    for (const double v : {c.routed_scaling_factor, c.rms_norm_eps, c.rope_theta}) {
      EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
    }
    for (const int64_t id : c.eos_token_ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, c.vocab_size);
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(accepted, 50);  // both outcomes occur (e.g. a digit of max_position_embeddings)
}

TEST(Config, MissingRequiredField) {
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "kv_lora_rank",
                          "q_lora_rank", "qk_rope_head_dim", "n_routed_experts"}) {
    json j = valid_config();
    j.erase(key);
    expect_error(j, {"c.json", std::string("field '") + key + "'", "missing"});
  }
}

TEST(Config, CrossFieldRules) {
  json j = valid_config();
  j["n_routed_experts"] = 18;  // not a multiple of n_group 4
  expect_error(j, {"field 'n_routed_experts'", "multiple of n_group (4)", "found 18"});

  j = valid_config();
  j["topk_group"] = 5;
  expect_error(j, {"field 'topk_group'", "<= n_group (4)", "found 5"});

  j = valid_config();
  j["num_experts_per_tok"] = 17;
  expect_error(j, {"field 'num_experts_per_tok'", "<= n_routed_experts (16)", "found 17"});

  j = valid_config();
  j["num_experts_per_tok"] = 9;  // only 2 groups of 4 experts survive
  expect_error(j, {"field 'num_experts_per_tok'", "topk_group", "found 9"});

  j = valid_config();
  j["n_routed_experts"] = 1028;  // beyond the router's 1024 (a multiple of n_group 4)
  expect_error(j, {"field 'n_routed_experts'", "<= 1024", "found 1028"});

  j = valid_config();
  j["n_group"] = 512;
  j["n_routed_experts"] = 1024;
  expect_error(j, {"field 'n_group'", "<= 256", "found 512"});

  j = valid_config();
  j["qk_rope_head_dim"] = 15;
  expect_error(j, {"field 'qk_rope_head_dim'", "even", "found 15"});

  j = valid_config();
  j["scoring_func"] = "softmax";
  expect_error(j, {"field 'scoring_func'", "noaux_tc requires", "softmax"});
  j["topk_method"] = "greedy";
  EXPECT_TRUE(parse(j).ok());

  j = valid_config();
  j["first_k_dense_replace"] = 4;
  expect_error(j, {"field 'first_k_dense_replace'", "found 4"});

  j = valid_config();
  j["eos_token_id"] = {1, 600};
  expect_error(j, {"field 'eos_token_id'", "vocab_size (512)", "found 600"});
}

TEST(Config, RopeScalingAndQuantizationErrors) {
  json j = valid_config();
  j["rope_scaling"]["type"] = "linear";
  expect_error(j, {"field 'rope_scaling.type'", "\"yarn\"", "\"linear\""});
  j = valid_config();
  j["rope_scaling"].erase("factor");
  expect_error(j, {"field 'rope_scaling.factor'"});
  j = valid_config();
  j["rope_scaling"]["factor"] = 0.5;
  expect_error(j, {"field 'rope_scaling.factor'", ">= 1", "0.5"});
  j = valid_config();
  j["rope_scaling"]["original_max_position_embeddings"] = "4k";
  expect_error(j, {"field 'rope_scaling.original_max_position_embeddings'", "\"4k\""});
  j = valid_config();
  j["rope_scaling"] = 3;
  expect_error(j, {"field 'rope_scaling'", "an object or null", "3"});

  j = valid_config();
  j["quantization_config"]["quant_method"] = "awq";
  expect_error(j, {"field 'quantization_config.quant_method'", "\"fp8\"", "\"awq\""});
  // GPTQ is read (model/quant_config.h); an fp8 config relabelled gptq lacks its fields.
  j["quantization_config"]["quant_method"] = "gptq";
  expect_error(j, {"field 'quantization_config.bits'", "expected 4", "found null"});
  j = valid_config();
  j["quantization_config"]["fmt"] = "e5m2";
  expect_error(j, {"field 'quantization_config.fmt'", "\"e4m3\"", "\"e5m2\""});
  j = valid_config();
  j["quantization_config"].erase("weight_block_size");
  expect_error(j, {"field 'quantization_config.weight_block_size'", "found null"});
  j = valid_config();
  j["quantization_config"]["weight_block_size"] = {128};
  expect_error(j, {"field 'quantization_config.weight_block_size'", "[128]"});
  j = valid_config();
  j["quantization_config"]["activation_scheme"] = "static";
  expect_error(j, {"field 'quantization_config.activation_scheme'", "\"static\""});
}

TEST(Config, RejectsOtherArchitectures) {
  json j = valid_config();
  j["model_type"] = "qwen3_moe";
  expect_error(j, {"field 'model_type'", "deepseek_v3", "deepseek_v2", "\"qwen3_moe\""});
  j = valid_config();
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  expect_error(j, {"field 'architectures'", "DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM"});
  j = valid_config();
  j.erase("architectures");
  j.erase("model_type");
  expect_error(j, {"field 'model_type'", "found neither"});
}

TEST(Config, BadJson) {
  auto r = parse_deepseek_v3_config("{\"hidden_size\": ", "x/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x/config.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
  r = parse_deepseek_v3_config("[1, 2]", "x/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("JSON object"), std::string::npos);
}

class ConfigDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("xds_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigDir, EosFromGenerationConfigListOrInt) {
  write("config.json", valid_config().dump());
  auto r = load_deepseek_v3_config(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->eos_token_ids, std::vector<int64_t>{1});  // fallback: config.json

  write("generation_config.json", R"({"bos_token_id": 0, "eos_token_id": [7, 9]})");
  r = load_deepseek_v3_config(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{7, 9}));

  write("generation_config.json", R"({"eos_token_id": 5, "do_sample": true})");
  r = load_deepseek_v3_config(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->eos_token_ids, std::vector<int64_t>{5});

  write("generation_config.json", R"({"eos_token_id": "x"})");
  r = load_deepseek_v3_config(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("generation_config.json: field 'eos_token_id'"),
            std::string::npos)
      << r.status().message();
}

TEST_F(ConfigDir, BosFromGenerationConfigOverridesAndIsChecked) {
  write("config.json", valid_config().dump());  // bos_token_id 0, vocab_size 512
  write("generation_config.json", R"({"bos_token_id": 5, "eos_token_id": 1})");
  auto r = load_deepseek_v3_config(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->bos_token_id, std::optional<int64_t>(5));
  for (const char* bad : {"-1", "512", "\"1\"", "1.5"}) {
    SCOPED_TRACE(bad);
    write("generation_config.json", std::string(R"({"bos_token_id": )") + bad + "}");
    r = load_deepseek_v3_config(dir_.string());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("generation_config.json: field 'bos_token_id'"),
              std::string::npos)
        << r.status().message();
  }
}

TEST_F(ConfigDir, MissingConfigNamesTheFile) {
  auto r = load_deepseek_v3_config(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace xds

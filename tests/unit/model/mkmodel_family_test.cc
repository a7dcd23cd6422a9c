// mkmodel --arch kimi_k2 | deepseek_v2: config.json carries each family's published model_type,
// architectures and routing fields (values from the published configs of
// moonshotai/Kimi-K2-Instruct, deepseek-ai/DeepSeek-V2 and DeepSeek-V2-Lite), the tensors are
// the family's (no correction bias or MTP layer in DeepSeek-V2; q_proj in V2-Lite), and the
// checkpoint reads back as the family it claims to be.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "mkmodel/mkmodel.h"
#include "model/safetensors.h"
#include "test_files.h"

namespace xds {
namespace {

class MkModelFamily : public xds::testing::TempDirTest {
 protected:
  MkModelOptions tiny(const std::string& sub, const std::string& arch) const {
    MkModelOptions o;
    o.out_dir = path(sub);
    o.arch = arch;
    o.seed = 5;
    o.threads = 2;
    o.progress = false;
    return o;
  }
  nlohmann::json config(const std::string& sub) const {
    std::ifstream f(path(sub) + "/config.json");
    return nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(f), {}));
  }
  Checkpoint open(const std::string& sub) const {
    auto r = Checkpoint::open(path(sub));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::move(r).value();
  }
};

TEST_F(MkModelFamily, KimiK2) {
  ASSERT_TRUE(write_random_checkpoint(tiny("k", "kimi_k2")).ok());
  const nlohmann::json j = config("k");
  EXPECT_EQ(j["model_type"], "kimi_k2");
  EXPECT_EQ(j["architectures"], nlohmann::json({"DeepseekV3ForCausalLM"}));
  EXPECT_EQ(j["n_group"], 1);
  EXPECT_EQ(j["topk_group"], 1);
  EXPECT_EQ(j["routed_scaling_factor"], 2.827);
  EXPECT_EQ(j["scoring_func"], "sigmoid");
  EXPECT_EQ(j["topk_method"], "noaux_tc");
  EXPECT_EQ(j["norm_topk_prob"], true);
  EXPECT_EQ(j["num_nextn_predict_layers"], 0);
  EXPECT_EQ(j["rope_theta"], 50000.0);
  EXPECT_EQ(j["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(j["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(j["rope_scaling"]["beta_fast"], 1.0);
  EXPECT_EQ(j["rope_scaling"]["beta_slow"], 1.0);
  EXPECT_EQ(j["rope_scaling"]["mscale"], 1.0);
  EXPECT_EQ(j["rope_scaling"]["mscale_all_dim"], 1.0);
  // tiny: max_position_embeddings 512 = 32 · 16
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 16);
  auto c = load_deepseek_v3_config(path("k"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->family, DeepseekFamily::kKimiK2);
  Checkpoint ck = open("k");
  EXPECT_NE(ck.find("model.layers.1.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_EQ(ck.find("model.layers.3.eh_proj.weight"), nullptr);
}

TEST_F(MkModelFamily, DeepseekV2) {
  ASSERT_TRUE(write_random_checkpoint(tiny("v2", "deepseek_v2")).ok());
  const nlohmann::json j = config("v2");
  EXPECT_EQ(j["model_type"], "deepseek_v2");
  EXPECT_EQ(j["architectures"], nlohmann::json({"DeepseekV2ForCausalLM"}));
  EXPECT_EQ(j["scoring_func"], "softmax");
  EXPECT_EQ(j["topk_method"], "group_limited_greedy");
  EXPECT_EQ(j["norm_topk_prob"], false);
  EXPECT_EQ(j["routed_scaling_factor"], 16.0);
  EXPECT_EQ(j["n_group"], 4);  // the tiny preset's groups
  EXPECT_EQ(j["q_lora_rank"], 128);
  EXPECT_FALSE(j.contains("num_nextn_predict_layers"));
  auto c = load_deepseek_v3_config(path("v2"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->family, DeepseekFamily::kDeepseekV2);
  Checkpoint ck = open("v2");
  EXPECT_NE(ck.find("model.layers.1.mlp.gate.weight"), nullptr);
  EXPECT_EQ(ck.find("model.layers.1.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_NE(ck.find("model.layers.0.self_attn.q_a_proj.weight"), nullptr);
  EXPECT_EQ(ck.find("model.layers.3.input_layernorm.weight"), nullptr);  // no MTP layer
}

TEST_F(MkModelFamily, DeepseekV2LiteWithoutQLora) {
  MkModelOptions o = tiny("lite", "deepseek_v2");
  o.q_lora = false;
  o.yarn = true;
  ASSERT_TRUE(write_random_checkpoint(o).ok());
  const nlohmann::json j = config("lite");
  EXPECT_TRUE(j["q_lora_rank"].is_null());
  EXPECT_EQ(j["topk_method"], "greedy");
  EXPECT_EQ(j["n_group"], 1);
  EXPECT_EQ(j["topk_group"], 1);
  EXPECT_EQ(j["routed_scaling_factor"], 1.0);
  EXPECT_EQ(j["rope_scaling"]["mscale"], 0.707);
  EXPECT_EQ(j["rope_scaling"]["mscale_all_dim"], 0.707);
  Checkpoint ck = open("lite");
  EXPECT_TRUE(ck.require("model.layers.0.self_attn.q_proj.weight", {192, 256}).ok());
  EXPECT_EQ(ck.find("model.layers.0.self_attn.q_a_proj.weight"), nullptr);
}

TEST_F(MkModelFamily, ErrorsNameTheOption) {
  MkModelOptions o = tiny("bad", "deepseek_v2");
  o.mtp_layers = 1;
  Status s = write_random_checkpoint(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no MTP layers"), std::string::npos) << s.message();
  o = tiny("bad", "deepseek_v2");
  o.router_skew = "zipf:1";
  s = write_random_checkpoint(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("e_score_correction_bias"), std::string::npos) << s.message();
  o = tiny("bad", "mixtral");
  s = write_random_checkpoint(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown arch \"mixtral\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("\"qwen3_moe\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("\"glm4_moe\""), std::string::npos) << s.message();
}

}  // namespace
}  // namespace xds

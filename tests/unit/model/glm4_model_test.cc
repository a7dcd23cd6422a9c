// GLM-4.5 through the paged GQA cache, checked by a second algorithm: the same sequence run
// as one prefill (every token's logits), token by token (decode over the cache the earlier
// steps wrote) and in chunks, in f32; the MTP layer likewise (its own cache layer); the bf16
// and int8 caches and bf16 compute against f32 with teacher forcing (normalised error); and
// mkmodel's layout. The numbers themselves are checked against the float64 oracle by
// conformance.glm4_f32 and model_forward.*Glm4Oracle*.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "mkmodel/glm4_checkpoint.h"
#include "mkmodel/mkmodel.h"
#include "model/glm4_moe/glm4_moe.h"
#include "model/kv_cache.h"
#include "model/registry.h"
#include "model/safetensors.h"

namespace xds {
namespace {

namespace fs = std::filesystem;

std::string checkpoint_dir(const std::string& tag) {
  return (fs::temp_directory_path() /
          ("xds_glm4_model_test_" + tag + "_" + std::to_string(::getpid())))
      .string();
}

// Removes the checkpoints the tests wrote, once the process's tests are done.
class RemoveCheckpoints final : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    for (const char* tag : {"tiny", "air"}) fs::remove_all(checkpoint_dir(tag), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const remove_checkpoints =
    ::testing::AddGlobalTestEnvironment(new RemoveCheckpoints);

// mkmodel's tiny GLM-4.5 (biases, q/k norm, one MTP layer), or with GLM-4.5-Air's attention
// and a quarter of each head rotating.
std::string tiny_checkpoint(bool air = false) {
  static const std::string dirs[2] = {[] {
                                        const std::string d = checkpoint_dir("tiny");
                                        MkModelOptions o;
                                        o.out_dir = d;
                                        o.arch = "glm4_moe";
                                        o.seed = 5;
                                        o.threads = 1;
                                        o.progress = false;
                                        const Status s = write_random_checkpoint(o);
                                        EXPECT_TRUE(s.ok()) << s.message();
                                        return d;
                                      }(),
                                      [] {
                                        const std::string d = checkpoint_dir("air");
                                        MkModelOptions o;
                                        o.out_dir = d;
                                        o.arch = "glm4_moe";
                                        o.seed = 6;
                                        o.threads = 1;
                                        o.progress = false;
                                        o.qk_norm = false;
                                        o.attention_bias = false;
                                        o.partial_rotary_factor = 0.25;
                                        const Status s = write_random_checkpoint(o);
                                        EXPECT_TRUE(s.ok()) << s.message();
                                        return d;
                                      }()};
  return dirs[air ? 1 : 0];
}

std::unique_ptr<CausalLm> load(ComputeDType compute, KvCacheDType kv, bool air = false) {
  ModelOptions mo;
  mo.compute = compute;
  mo.kv_cache = kv;
  mo.threads = 2;
  auto m = load_causal_lm(tiny_checkpoint(air), mo);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(*m) : nullptr;
}

KvCache cache_for(const CausalLm& m, int64_t tokens) {
  KvStorageShape shape;
  shape.layout = m.kv_layout();
  shape.block_size = 16;
  shape.num_blocks = (tokens + 15) / 16 + 1;
  auto c = KvCache::create(shape, -1);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return std::move(*c);
}

// 40 tokens: across three 16-row blocks and three 16-token prefill tiles.
std::vector<int32_t> sequence() {
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
  return ids;
}

struct Logits {
  std::vector<float> main;  // [tokens, vocab]
  std::vector<float> mtp;   // [tokens - 1, vocab] the MTP layer's, teacher forced
};

// Every position's logits, main and MTP, in chunks of `chunk` tokens.
Logits run(CausalLm& m, int64_t chunk) {
  const std::vector<int32_t> ids = sequence();
  const int64_t d = m.info().hidden_size;
  KvCache cache = cache_for(m, static_cast<int64_t>(ids.size()));
  const int64_t seq = cache.add_sequence();
  Logits all;
  std::vector<float> hidden;  // [tokens, D] the main model's final-normed hidden
  for (size_t at = 0; at < ids.size(); at += static_cast<size_t>(chunk)) {
    const size_t n = std::min(ids.size() - at, static_cast<size_t>(chunk));
    auto c = cache.chunk(seq, static_cast<int64_t>(at),
                         std::span<const int32_t>(ids).subspan(at, n), /*all_logits=*/true);
    EXPECT_TRUE(c.ok()) << c.status().message();
    StepOutput out;
    Status s = m.forward(std::span<const TokenChunk>(&*c, 1), cache.storage(), out);
    EXPECT_TRUE(s.ok()) << s.message();
    all.main.insert(all.main.end(), out.logits.begin(), out.logits.end());
    hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());
    // MTP rows of the positions whose next token is known: [at, min(at + n, len - 1)).
    const size_t rows = std::min(n, ids.size() - 1 - at);
    auto mc = cache.mtp_chunk(seq, static_cast<int64_t>(at),
                              std::span<const int32_t>(ids).subspan(at + 1, rows),
                              hidden.data() + at * d);
    EXPECT_TRUE(mc.ok()) << mc.status().message();
    StepOutput draft;
    s = m.forward_mtp(0, std::span<const MtpChunk>(&*mc, 1), cache.storage(), draft);
    EXPECT_TRUE(s.ok()) << s.message();
    all.mtp.insert(all.mtp.end(), draft.logits.begin(), draft.logits.end());
  }
  return all;
}

// max |a - b| / max |b| over rows of `vocab`.
double worst_row_error(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t r = 0; r * vocab < std::min(a.size(), b.size()); ++r) {
    double err = 0, scale = 1e-30;
    for (int64_t i = 0; i < vocab; ++i) {
      err = std::max(err, std::abs(double(a[r * vocab + i]) - b[r * vocab + i]));
      scale = std::max(scale, std::abs(double(b[r * vocab + i])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

TEST(Glm4Model, DecodeThroughTheCacheEqualsPrefill) {
  for (bool air : {false, true}) {
    auto m = load(ComputeDType::kF32, KvCacheDType::kAuto, air);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->info().model_type, "glm4_moe");
    EXPECT_EQ(m->info().n_mtp_layers, 1);
    EXPECT_EQ(m->info().moe_layers, (std::vector<int64_t>{1, 2, 3}));  // 0 dense, 3 the MTP
    EXPECT_EQ(m->info().n_shared_experts, 1);
    EXPECT_EQ(m->kv_layout().layers, 4);
    const int64_t vocab = m->info().vocab_size;
    const Logits prefill = run(*m, 40), decode = run(*m, 1), chunks = run(*m, 7);
    EXPECT_EQ(prefill.mtp.size(), static_cast<size_t>(39 * vocab));
    EXPECT_LT(worst_row_error(decode.main, prefill.main, vocab), 1e-5) << air;
    EXPECT_LT(worst_row_error(chunks.main, prefill.main, vocab), 1e-5) << air;
    EXPECT_LT(worst_row_error(decode.mtp, prefill.mtp, vocab), 1e-5) << air;
    EXPECT_LT(worst_row_error(chunks.mtp, prefill.mtp, vocab), 1e-5) << air;
  }
}

TEST(Glm4Model, Bf16AndInt8CachesAndBf16ComputeStayNearF32) {
  auto f32 = load(ComputeDType::kF32, KvCacheDType::kAuto);
  auto kv_bf16 = load(ComputeDType::kF32, KvCacheDType::kBF16);
  auto bf16 = load(ComputeDType::kBF16, KvCacheDType::kAuto);
  auto i8 = load(ComputeDType::kF32, KvCacheDType::kInt8);
  ASSERT_TRUE(f32 && kv_bf16 && bf16 && i8);
  EXPECT_EQ(static_cast<Glm4MoeModel&>(*kv_bf16).kv_cache_dtype(), DType::kBF16);
  EXPECT_EQ(static_cast<Glm4MoeModel&>(*bf16).kv_cache_dtype(), DType::kBF16);
  EXPECT_EQ(static_cast<Glm4MoeModel&>(*i8).kv_cache_dtype(), DType::kI8);
  const int64_t vocab = f32->info().vocab_size;
  const Logits ref = run(*f32, 40);
  // bf16 rounding (2^-9 relative) of the cached K/V, and of the linears' inputs too; int8
  // rows move by at most half a step of absmax / 127.
  EXPECT_LT(worst_row_error(run(*kv_bf16, 40).main, ref.main, vocab), 2e-2);
  EXPECT_LT(worst_row_error(run(*bf16, 40).main, ref.main, vocab), 5e-2);
  EXPECT_LT(worst_row_error(run(*bf16, 40).mtp, ref.mtp, vocab), 5e-2);
  EXPECT_LT(worst_row_error(run(*i8, 40).main, ref.main, vocab), 5e-2);
  EXPECT_LT(worst_row_error(run(*bf16, 1).main, run(*bf16, 40).main, vocab), 1e-5);
}

TEST(Glm4Model, RefusedPathsAndBadInputSayWhat) {
  ModelOptions mo;
  mo.attention = AttentionMode::kExpanded;
  auto m = load_causal_lm(tiny_checkpoint(), mo);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("MLA modes"), std::string::npos);
  auto ok = load(ComputeDType::kF32, KvCacheDType::kAuto);
  ASSERT_NE(ok, nullptr);
  KvCache cache = cache_for(*ok, 16);
  StepOutput out;
  Status s = ok->forward_mtp(1, {}, cache.storage(), out);
  EXPECT_NE(s.message().find("MTP layer 1 requested, the model has 1"), std::string::npos)
      << s.message();
  const int64_t seq = cache.add_sequence();
  const std::vector<int32_t> bad = {3, 256};
  auto c = cache.chunk(seq, 0, bad);
  ASSERT_TRUE(c.ok());
  s = ok->forward({&*c, 1}, cache.storage(), out);
  EXPECT_NE(s.message().find("token 1 is id 256, out of range [0, 256)"), std::string::npos)
      << s.message();
  // A step with no tokens runs (every MoE layer joins its exchange) and gives nothing.
  EXPECT_TRUE(ok->forward({}, cache.storage(), out).ok());
  EXPECT_TRUE(out.logits.empty());
  EXPECT_TRUE(ok->forward_mtp(0, {}, cache.storage(), out).ok());
}

TEST(Glm4Mkmodel, WritesThePublishedLayout) {
  std::ifstream f(tiny_checkpoint() + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"Glm4MoeForCausalLM"}));
  EXPECT_EQ(j["model_type"], "glm4_moe");
  for (const char* key :
       {"partial_rotary_factor", "attention_bias", "use_qk_norm", "n_routed_experts",
        "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group",
        "routed_scaling_factor", "num_nextn_predict_layers", "head_dim", "eos_token_id"})
    EXPECT_TRUE(j.contains(key)) << key;
  auto full = Checkpoint::open(tiny_checkpoint());
  auto air = Checkpoint::open(tiny_checkpoint(/*air=*/true));
  ASSERT_TRUE(full.ok() && air.ok());
  for (const char* name :
       {"model.layers.1.self_attn.q_proj.bias", "model.layers.0.self_attn.k_norm.weight",
        "model.layers.3.self_attn.v_proj.bias"})
    EXPECT_NE(full->find(name), nullptr) << name;
  for (const char* name :
       {"model.layers.3.eh_proj.weight", "model.layers.3.shared_head.head.weight",
        "model.layers.3.mlp.shared_experts.down_proj.weight"})
    EXPECT_NE(full->find(name), nullptr) << name;
  const TensorView* bias = full->find("model.layers.2.mlp.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype, DType::kF32);
  EXPECT_EQ(air->find("model.layers.1.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(air->find("model.layers.1.self_attn.q_norm.weight"), nullptr);
  MkModelOptions o;
  o.arch = "glm4_moe";
  o.yarn = true;
  EXPECT_NE(glm4_mkmodel_config(o).status().message().find("not supported for GLM-4.5"),
            std::string::npos);
  o.yarn = false;
  o.preset = "bench-2.6b";
  EXPECT_NE(glm4_mkmodel_config(o).status().message().find("--preset must be tiny"),
            std::string::npos);
}

}  // namespace
}  // namespace xds

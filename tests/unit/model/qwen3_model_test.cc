// Qwen3-MoE through the paged GQA cache, checked by a second algorithm: the same sequence run
// as one prefill (every token's logits) and token by token (decode, each step attending over
// the cache the earlier steps wrote), in f32; and the bf16 cache, the int8 cache and bf16
// compute against f32 with teacher forcing (normalised error). The numbers themselves are checked
// against the float64 oracle by conformance.qwen3_f32.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "mkmodel/mkmodel.h"
#include "mkmodel/qwen3_checkpoint.h"
#include "model/kv_cache.h"
#include "model/qwen3_moe/qwen3_moe.h"
#include "model/registry.h"

namespace xds {
namespace {

// Removes the checkpoint tiny_checkpoint() wrote, once the process's tests are done.
class RemoveCheckpoint final : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir(), ec);
  }
  static std::string dir() {
    return (std::filesystem::temp_directory_path() /
            ("xds_qwen3_model_test_" + std::to_string(::getpid())))
        .string();
  }
};
[[maybe_unused]] ::testing::Environment* const remove_checkpoint =
    ::testing::AddGlobalTestEnvironment(new RemoveCheckpoint);

std::string tiny_checkpoint() {
  static const std::string dir = [] {
    const std::string d = RemoveCheckpoint::dir();
    MkModelOptions o;
    o.out_dir = d;
    o.arch = "qwen3_moe";
    o.preset = "tiny";
    o.seed = 5;
    o.threads = 1;
    const Status s = write_random_checkpoint(o);
    EXPECT_TRUE(s.ok()) << s.message();
    return d;
  }();
  return dir;
}

std::unique_ptr<CausalLm> load(ComputeDType compute, KvCacheDType kv) {
  ModelOptions mo;
  mo.compute = compute;
  mo.kv_cache = kv;
  mo.threads = 2;
  auto m = load_causal_lm(tiny_checkpoint(), mo);
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

// [tokens, vocab] logits of every position, by one prefill (chunks of `chunk` tokens).
std::vector<float> run(CausalLm& m, int64_t chunk) {
  const std::vector<int32_t> ids = sequence();
  KvCache cache = cache_for(m, static_cast<int64_t>(ids.size()));
  const int64_t seq = cache.add_sequence();
  std::vector<float> all;
  for (size_t at = 0; at < ids.size(); at += static_cast<size_t>(chunk)) {
    const size_t n = std::min(ids.size() - at, static_cast<size_t>(chunk));
    auto c = cache.chunk(seq, static_cast<int64_t>(at),
                         std::span<const int32_t>(ids).subspan(at, n), /*all_logits=*/true);
    EXPECT_TRUE(c.ok()) << c.status().message();
    StepOutput out;
    const Status s = m.forward(std::span<const TokenChunk>(&*c, 1), cache.storage(), out);
    EXPECT_TRUE(s.ok()) << s.message();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  return all;
}

// max |a - b| / max |b| over rows of `vocab`.
double worst_row_error(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double worst = 0;
  for (size_t r = 0; r * vocab < b.size(); ++r) {
    double err = 0, scale = 1e-30;
    for (int64_t i = 0; i < vocab; ++i) {
      err = std::max(err, std::abs(double(a[r * vocab + i]) - b[r * vocab + i]));
      scale = std::max(scale, std::abs(double(b[r * vocab + i])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

TEST(Qwen3Model, DecodeThroughTheCacheEqualsPrefill) {
  auto m = load(ComputeDType::kF32, KvCacheDType::kAuto);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->info().model_type, "qwen3_moe");
  EXPECT_EQ(m->info().moe_layers, (std::vector<int64_t>{1, 2}));  // layer 0 is mlp_only
  const int64_t vocab = m->info().vocab_size;
  const std::vector<float> prefill = run(*m, 40);
  const std::vector<float> decode = run(*m, 1);
  const std::vector<float> chunks = run(*m, 7);
  ASSERT_EQ(prefill.size(), decode.size());
  EXPECT_LT(worst_row_error(decode, prefill, vocab), 1e-5);
  EXPECT_LT(worst_row_error(chunks, prefill, vocab), 1e-5);
}

TEST(Qwen3Model, Bf16CacheAndComputeStayNearF32) {
  auto f32 = load(ComputeDType::kF32, KvCacheDType::kAuto);
  auto kv_bf16 = load(ComputeDType::kF32, KvCacheDType::kBF16);
  auto bf16 = load(ComputeDType::kBF16, KvCacheDType::kAuto);
  ASSERT_TRUE(f32 && kv_bf16 && bf16);
  EXPECT_EQ(static_cast<Qwen3MoeModel&>(*kv_bf16).kv_cache_dtype(), DType::kBF16);
  EXPECT_EQ(static_cast<Qwen3MoeModel&>(*bf16).kv_cache_dtype(), DType::kBF16);
  const int64_t vocab = f32->info().vocab_size;
  const std::vector<float> ref = run(*f32, 40);
  // bf16 rounding (2^-9 relative) of the cached K/V, and of the linears' inputs too.
  EXPECT_LT(worst_row_error(run(*kv_bf16, 40), ref, vocab), 2e-2);
  EXPECT_LT(worst_row_error(run(*bf16, 40), ref, vocab), 5e-2);
  // decode in bf16 reads the same bf16 rows as prefill
  EXPECT_LT(worst_row_error(run(*bf16, 1), run(*bf16, 40), vocab), 1e-5);
}

TEST(Qwen3Model, Int8CacheStaysNearF32) {
  auto f32 = load(ComputeDType::kF32, KvCacheDType::kAuto);
  auto i8 = load(ComputeDType::kF32, KvCacheDType::kInt8);
  ASSERT_TRUE(f32 && i8);
  EXPECT_EQ(static_cast<Qwen3MoeModel&>(*i8).kv_cache_dtype(), DType::kI8);
  const int64_t vocab = f32->info().vocab_size;
  // absmax / 127 per cached row: an element moves by at most half a step.
  EXPECT_LT(worst_row_error(run(*i8, 40), run(*f32, 40), vocab), 5e-2);
  EXPECT_LT(worst_row_error(run(*i8, 1), run(*i8, 40), vocab), 1e-5);
}

TEST(Qwen3Model, UnsupportedPathsRefusedInOneLine) {
  ModelOptions mo;
  mo.attention = AttentionMode::kAbsorbed;
  auto m = load_causal_lm(tiny_checkpoint(), mo);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("MLA modes"), std::string::npos);
  mo.attention = AttentionMode::kAuto;
  auto ok = load_causal_lm(tiny_checkpoint(), mo);
  ASSERT_TRUE(ok.ok());
  KvCache cache = cache_for(**ok, 16);
  StepOutput out;
  const Status s = (*ok)->forward_mtp(0, {}, cache.storage(), out);
  EXPECT_NE(s.message().find("no MTP layers"), std::string::npos) << s.message();
}

TEST(Qwen3Mkmodel, BenchPresetHasQwen3_30B_A3B_LayerShape) {
  MkModelOptions o;
  o.arch = "qwen3_moe";
  o.preset = "bench-qwen3";
  auto c = qwen3_mkmodel_config(o);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->num_hidden_layers, 6);
  for (int64_t l = 0; l < 6; ++l) EXPECT_TRUE(c->is_moe_layer(l));
  o.preset = "bench-2.6b";
  EXPECT_NE(qwen3_mkmodel_config(o).status().message().find("tiny or bench-qwen3"),
            std::string::npos);
  o.preset = "tiny";
  o.weights_int8 = true;
  EXPECT_NE(qwen3_mkmodel_config(o).status().message().find("not supported for Qwen3-MoE"),
            std::string::npos);
}

}  // namespace
}  // namespace xds

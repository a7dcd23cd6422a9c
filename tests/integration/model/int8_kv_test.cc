// The INT8 latent KV cache (--kv-cache-dtype int8) in the forward pass: every attention path
// reads the stored (quantized) rows, so a decode step over the cache gives the logits of a
// from-scratch pass over the same positions (which quantizes the same rows the same way,
// then reads them back); and the quantization costs the shipped model less than 0.5 % of
// perplexity on its held-out rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "kernels/cpu/mla_attention.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "test_models.h"

namespace xds {
namespace {

using fixtures::random_ids;

std::unique_ptr<DeepseekV3Model> load(const std::string& dir, ComputeDType compute, KvCacheDType kv,
                                      AttentionMode attention) {
  ModelOptions mo;
  mo.compute = compute;
  mo.kv_cache = kv;
  mo.attention = attention;
  return fixtures::load_deepseek(dir, mo);
}

using fixtures::chunk;

// Logits of every position of `ids`, one prefill chunk from an empty cache.
std::vector<float> from_scratch(DeepseekV3Model& m, std::span<const int32_t> ids) {
  KvCache cache = m.make_cache(static_cast<int64_t>(ids.size()) + 16).value();
  const int64_t seq = cache.add_sequence();
  StepOutput out;
  const TokenChunk ch = chunk(cache, seq, 0, ids, true);
  EXPECT_TRUE(m.forward({&ch, 1}, cache.storage(), out).ok());
  return out.logits;
}

// Logits of positions [first, n) of `ids`: a prefill of [0, first), then one decode step a
// position.
std::vector<float> decoded(DeepseekV3Model& m, std::span<const int32_t> ids, int64_t first) {
  const int64_t n = static_cast<int64_t>(ids.size());
  KvCache cache = m.make_cache(n + 16).value();
  const int64_t seq = cache.add_sequence();
  StepOutput out;
  const TokenChunk prefill = chunk(cache, seq, 0, ids.first(static_cast<size_t>(first)), false);
  EXPECT_TRUE(m.forward({&prefill, 1}, cache.storage(), out).ok());
  std::vector<float> logits;
  for (int64_t p = first; p < n; ++p) {
    const TokenChunk step = chunk(cache, seq, p, ids.subspan(static_cast<size_t>(p), 1), false);
    EXPECT_TRUE(m.forward({&step, 1}, cache.storage(), out).ok());
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
  }
  return logits;
}

TEST(Int8Kv, TheCacheHoldsAnInt8LatentWithTheRopePlaneAsAuto) {
  const std::string dir = fixtures::random_checkpoint("int8kv_layout", 5);
  const auto m = load(dir, ComputeDType::kF32, KvCacheDType::kInt8, AttentionMode::kAuto);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->kv_cache_dtype(), DType::kI8);
  EXPECT_EQ(m->kv_rope_dtype(), DType::kF32);
  const KvLayout l = m->kv_layout();
  ASSERT_EQ(l.planes.size(), 3u);
  EXPECT_EQ(l.planes[0].dtype, DType::kI8);
  EXPECT_EQ(l.planes[0].elements, m->config().kv_lora_rank);
  EXPECT_EQ(l.planes[1].dtype, DType::kF32);
  EXPECT_EQ(l.planes[2].elements, m->config().qk_rope_head_dim);
  KvCache cache = m->make_cache(64).value();
  EXPECT_TRUE(cache.storage().is_int8());
  if (kernels::absorbed_bf16_available()) {
    const auto fast = load(dir, ComputeDType::kBF16, KvCacheDType::kInt8, AttentionMode::kAuto);
    ASSERT_NE(fast, nullptr);
    EXPECT_EQ(fast->kv_rope_dtype(), DType::kBF16);
  }
}

// f32 compute: decode steps (the absorbed form over the INT8 rows, at 520 rows two parts
// and past kInt8ChunkRows, so dequantized chunks fold) against one prefill chunk (the
// expanded form over the same rows, dequantized by its gather). Different sums of the same
// numbers: the f32 tolerance of the float cache's decode-vs-prefill test.
TEST(Int8Kv, DecodeEqualsRecomputeInF32) {
  const std::string dir = fixtures::random_checkpoint("int8kv_f32", 13);
  const auto m = load(dir, ComputeDType::kF32, KvCacheDType::kInt8, AttentionMode::kAuto);
  ASSERT_NE(m, nullptr);
  const int64_t v = m->config().vocab_size, n = 520, first = 516;
  ASSERT_EQ(kernels::absorbed_context_split(n).count, 2);
  const auto ids = random_ids(n, v, 4);
  const std::vector<float> ref = from_scratch(*m, ids);
  const std::vector<float> dec = decoded(*m, ids, first);
  ASSERT_EQ(dec.size(), static_cast<size_t>((n - first) * v));
  for (int64_t p = first; p < n; ++p)
    for (int64_t i = 0; i < v; ++i) {
      const float r = ref[p * v + i];
      ASSERT_NEAR(dec[(p - first) * v + i], r, 1e-5f * (1.0f + std::fabs(r)))
          << "position " << p << " vocab " << i;
    }
  // The quantization is not the identity: an f32 cache gives other logits.
  const auto f32 = load(dir, ComputeDType::kF32, KvCacheDType::kF32, AttentionMode::kAuto);
  ASSERT_NE(f32, nullptr);
  const std::vector<float> exact = from_scratch(*f32, ids);
  double diff = 0;
  for (size_t i = 0; i < exact.size(); ++i)
    diff = std::max(diff, double(std::fabs(exact[i] - ref[i])));
  EXPECT_GT(diff, 1e-4);
}

// The fast mode, every position through the absorbed form (the bf16 products over
// dequantized chunks): a position's attention is a function of its context alone, so decode
// steps give the bits of the prefill that computed the same position.
TEST(Int8Kv, DecodeEqualsRecomputeInTheFastMode) {
  if (!kernels::absorbed_bf16_available()) GTEST_SKIP() << "no AVX512_BF16 attention kernel";
  const std::string dir = fixtures::random_checkpoint("int8kv_bf16", 17);
  const auto m = load(dir, ComputeDType::kBF16, KvCacheDType::kInt8, AttentionMode::kAbsorbed);
  ASSERT_NE(m, nullptr);
  const int64_t v = m->config().vocab_size, n = 520, first = 516;
  const auto ids = random_ids(n, v, 6);
  const std::vector<float> ref = from_scratch(*m, ids);
  const std::vector<float> dec = decoded(*m, ids, first);
  ASSERT_EQ(dec.size(), static_cast<size_t>((n - first) * v));
  EXPECT_EQ(std::memcmp(dec.data(), ref.data() + first * v, sizeof(float) * dec.size()), 0);
}

// The MTP layer caches its own INT8 rows: its 11 rows in one pass (the expanded form over
// the stored rows) equal the first 10 then the 11th decoded over them (the absorbed form),
// within the f32 tolerance; and its logits differ from an f32 cache's (the rows are read).
TEST(Int8Kv, MtpLayerDecodeEqualsRecompute) {
  const std::string dir = fixtures::random_checkpoint("int8kv_mtp", 3);
  const auto m = load(dir, ComputeDType::kF32, KvCacheDType::kInt8, AttentionMode::kAuto);
  ASSERT_NE(m, nullptr);
  const int64_t v = m->config().vocab_size, d = m->config().hidden_size;
  const auto ids = random_ids(12, v, 4);
  auto mtp_chunk = [](KvCache& cache, int64_t seq, int64_t start, std::span<const int32_t> next,
                      const float* hidden) {
    Result<MtpChunk> c = cache.mtp_chunk(seq, start, next, hidden);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? *c : MtpChunk{};
  };
  auto all_rows = [&](DeepseekV3Model& model) {
    KvCache cache = model.make_cache(64).value();
    const int64_t seq = cache.add_sequence();
    StepOutput main_out, out;
    const TokenChunk ch = chunk(cache, seq, 0, ids, true);
    EXPECT_TRUE(model.forward({&ch, 1}, cache.storage(), main_out).ok());
    const MtpChunk all =
        mtp_chunk(cache, seq, 0, std::span(ids).subspan(1, 11), main_out.hidden.data());
    EXPECT_TRUE(model.forward_mtp(0, {&all, 1}, cache.storage(), out).ok());
    return out.logits;
  };
  const std::vector<float> whole = all_rows(*m);
  ASSERT_EQ(whole.size(), static_cast<size_t>(11 * v));
  KvCache cache = m->make_cache(64).value();
  const int64_t seq = cache.add_sequence();
  StepOutput main_out, step;
  const TokenChunk ch = chunk(cache, seq, 0, ids, true);
  ASSERT_TRUE(m->forward({&ch, 1}, cache.storage(), main_out).ok());
  const MtpChunk first =
      mtp_chunk(cache, seq, 0, std::span(ids).subspan(1, 10), main_out.hidden.data());
  ASSERT_TRUE(m->forward_mtp(0, {&first, 1}, cache.storage(), step).ok());
  const MtpChunk last =
      mtp_chunk(cache, seq, 10, std::span(ids).subspan(11, 1), main_out.hidden.data() + 10 * d);
  ASSERT_TRUE(m->forward_mtp(0, {&last, 1}, cache.storage(), step).ok());
  for (int64_t i = 0; i < v; ++i) {
    const float r = whole[10 * v + i];
    ASSERT_NEAR(step.logits[i], r, 1e-5f * (1.0f + std::fabs(r))) << "vocab " << i;
  }
  const auto f32 = load(dir, ComputeDType::kF32, KvCacheDType::kF32, AttentionMode::kAuto);
  ASSERT_NE(f32, nullptr);
  const std::vector<float> exact = all_rows(*f32);
  double diff = 0;
  for (size_t i = 0; i < exact.size(); ++i)
    diff = std::max(diff, double(std::fabs(exact[i] - whole[i])));
  EXPECT_GT(diff, 1e-5);
}

// The shipped model teacher-forced on its three held-out rows (tests/conformance), f32
// compute: perplexity with the INT8 latent within 0.5 % of the f32 cache's.
TEST(Int8Kv, PerplexityOfTheShippedModelWithinHalfAPercent) {
  constexpr int64_t kRows = 3, kLen = 64;
  const std::string path =
      std::string(XDS_SOURCE_DIR) + "/tests/conformance/kjv_moe_tiny/tokens.i32";
  std::vector<int32_t> tokens(static_cast<size_t>(kRows * kLen));
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
  ASSERT_TRUE(f.good()) << path;
  const std::string dir = std::string(XDS_SOURCE_DIR) + "/models/kjv-moe-tiny";
  auto cross_entropy = [&](KvCacheDType kv) {
    const auto m = load(dir, ComputeDType::kF32, kv, AttentionMode::kAuto);
    EXPECT_NE(m, nullptr);
    if (m == nullptr) return 0.0;
    const int64_t v = m->config().vocab_size;
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const auto row = std::span<const int32_t>(tokens).subspan(r * kLen, kLen);
      const std::vector<float> logits = from_scratch(*m, row);
      for (int64_t t = 0; t + 1 < kLen; ++t) {
        const float* x = logits.data() + t * v;
        const double mx = *std::max_element(x, x + v);
        double z = 0;
        for (int64_t i = 0; i < v; ++i) z += std::exp(double(x[i]) - mx);
        sum += mx + std::log(z) - double(x[row[t + 1]]);
        ++count;
      }
    }
    return sum / static_cast<double>(count);
  };
  const double ce_f32 = cross_entropy(KvCacheDType::kF32),
               ce_i8 = cross_entropy(KvCacheDType::kInt8);
  const double ratio = std::exp(ce_i8 - ce_f32);  // perplexity ratio
  std::fprintf(stderr, "perplexity f32 KV %.4f, int8 KV %.4f (%+.3f%%)\n", std::exp(ce_f32),
               std::exp(ce_i8), 100 * (ratio - 1));
  EXPECT_NE(ce_i8, ce_f32);  // the INT8 rows are read
  EXPECT_LT(std::fabs(ratio - 1), 0.005);
}

}  // namespace
}  // namespace xds

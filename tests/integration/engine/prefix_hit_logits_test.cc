// A prefix-cache hit gives the logits of a cold run: the DP group's KV bookkeeping
// (KvManager: attach the cached chain, reserve the rest, commit) with the real model on a
// tiny random checkpoint, in f32. Cold: a fresh sequence computes the whole prompt. Warm: a
// first request computes and commits a prompt sharing the first blocks; the second attaches
// them from the prefix cache and computes only its tail. The last token's logits of both
// must agree to f32 rounding (the attached rows are the same bits; only the tail's
// attention sums in a different chunking).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "engine/kv_manager.h"
#include "mkmodel/mkmodel.h"
#include "model/kv_storage.h"
#include "model/registry.h"

namespace xds::engine {
namespace {

constexpr int64_t kBlock = 16;

std::string tiny_dir() {
  static const std::string dir = [] {
    const std::string d =
        (std::filesystem::temp_directory_path() / "xds_prefix_hit_tiny").string();
    MkModelOptions o;
    o.out_dir = d;
    o.seed = 5;
    o.progress = false;
    const Status s = write_random_checkpoint(o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return d;
  }();
  return dir;
}

std::vector<int32_t> ids(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(2, 511);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Runs tokens [start, end) of `seq` in one chunk; returns the last token's logits.
std::vector<float> run(CausalLm& m, KvStorage& kv, KvManager& km, int64_t seq,
                       const std::vector<int32_t>& tokens, int64_t start) {
  const int64_t end = static_cast<int64_t>(tokens.size());
  EXPECT_TRUE(km.reserve(seq, end).ok());
  TokenChunk c;
  c.start_pos = start;
  c.tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(start));
  c.blocks = km.table(seq);
  StepOutput out;
  const Status s = m.forward({&c, 1}, kv, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(km.commit(seq, tokens).ok());
  return out.logits;
}

TEST(PrefixHit, GivesTheLogitsOfAColdRun) {
  ModelOptions mo;
  mo.threads = 1;
  auto model = load_causal_lm(tiny_dir(), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  CausalLm& m = **model;
  auto kv = KvStorage::create({m.kv_layout(), 64, kBlock}, -1);
  ASSERT_TRUE(kv.ok());

  // Two prompts sharing 3 full blocks (48 tokens), then different tails.
  std::vector<int32_t> first = ids(48, 1), second = ids(48, 1);
  const std::vector<int32_t> tail1 = ids(13, 2), tail2 = ids(21, 3);
  first.insert(first.end(), tail1.begin(), tail1.end());
  second.insert(second.end(), tail2.begin(), tail2.end());

  // Cold: the second prompt alone, no cache.
  auto cold_km = KvManager::create({.num_blocks = 64, .block_size = kBlock, .prefix_cache = false});
  ASSERT_TRUE(cold_km.ok());
  const int64_t cold_seq = cold_km->add_sequence();
  const std::vector<float> cold = run(m, *kv, *cold_km, cold_seq, second, 0);

  // Warm: the first prompt fills the cache; the second attaches its three blocks.
  auto km = KvManager::create({.num_blocks = 64, .block_size = kBlock, .prefix_cache = true});
  ASSERT_TRUE(km.ok());
  const int64_t a = km->add_sequence();
  (void)run(m, *kv, *km, a, first, 0);
  km->free(a);
  const int64_t b = km->add_sequence();
  const int64_t hit = km->attach_prefix(b, second, (static_cast<int64_t>(second.size()) - 1) / kBlock);
  ASSERT_EQ(hit, 48) << "three full blocks come from the cache";
  const std::vector<float> warm = run(m, *kv, *km, b, second, hit);
  km->check_invariants();

  ASSERT_EQ(cold.size(), warm.size());
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < cold.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(cold[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(cold[i]) - warm[i]));
  }
  EXPECT_LE(max_diff, 1e-4 * max_abs) << "warm logits differ from cold by " << max_diff;
}

}  // namespace
}  // namespace xds::engine

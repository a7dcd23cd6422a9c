// What the integration tests of the model and the engine share: random checkpoints written by
// mkmodel, random token ids, loading a checkpoint as a test does it (2 threads, failures
// reported to the running test) and reserving a cache chunk the same way.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3/deepseek_v3.h"

namespace xds::fixtures {

// mkmodel's tiny random checkpoint in a temporary directory named after `name` (each test its
// own: CTest runs a binary's tests in parallel processes).
inline std::string random_checkpoint(const std::string& name, uint64_t seed, int mtp_layers = 1) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("xds_" + name)).string();
  MkModelOptions o;
  o.out_dir = dir;
  o.seed = seed;
  o.mtp_layers = mtp_layers;
  o.progress = false;
  const Status s = write_random_checkpoint(o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

// n ids uniform in [0, vocab) from mt19937(seed).
inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// The checkpoint in `dir` with options `mo` (default ones unless given) and 2 threads;
// nullptr (and a test failure) when it does not load.
inline std::unique_ptr<DeepseekV3Model> load_deepseek(const std::string& dir,
                                                      ModelOptions mo = {}) {
  mo.threads = 2;
  auto m = DeepseekV3Model::load(dir, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

// The chunk of `seq` at `start` with its blocks reserved in `cache` (an empty chunk and a
// test failure when the cache refuses it).
inline TokenChunk chunk(KvCache& cache, int64_t seq, int64_t start,
                        std::span<const int32_t> tokens, bool all_logits) {
  Result<TokenChunk> c = cache.chunk(seq, start, tokens, all_logits);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : TokenChunk{};
}

}  // namespace xds::fixtures

// What the integration tests of the model and the engine share: random checkpoints written by
// mkmodel, random token ids, and loading a checkpoint as a test does it (2 threads, failures
// reported to the running test).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3.h"

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

// The checkpoint in `dir` with default options and 2 threads; nullptr (and a test failure)
// when it does not load.
inline std::unique_ptr<DeepseekV3Model> load_deepseek(const std::string& dir) {
  ModelOptions mo;
  mo.threads = 2;
  auto m = DeepseekV3Model::load(dir, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

}  // namespace xds::fixtures

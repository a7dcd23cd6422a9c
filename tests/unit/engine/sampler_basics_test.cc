// The sampler's basic cases by hand-derived values: greedy ties and the valid vocabulary,
// top-k 1, frequencies against the softmax, the top-p prefix, the draws' range, and a NaN
// row refused (generate and serve share this sampler).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/sampler.h"

namespace xds::engine {
namespace {

SamplingOptions options(float temperature, float top_p, int32_t top_k, uint64_t seed) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_p = top_p;
  o.top_k = top_k;
  o.seed = seed;
  return o;
}

SampleInput row(const float* logits, int64_t valid_vocab, const SamplingOptions& o,
                int64_t position = 0) {
  SampleInput in;
  in.logits = logits;
  in.valid_vocab = valid_vocab;
  in.options = &o;
  in.position = position;
  return in;
}

TEST(SamplerBasics, GreedyTakesLowestIdOnTiesAndRespectsValidVocab) {
  Sampler s;
  const float logits[] = {1.0f, 3.0f, 3.0f, 9.0f};
  const SamplingOptions greedy = options(0.0f, 1.0f, 0, 0);
  EXPECT_EQ(s.sample(row(logits, 4, greedy), nullptr).value(), 3);
  EXPECT_EQ(s.sample(row(logits, 3, greedy), nullptr).value(), 1);  // id 3 is beyond the vocabulary
}

TEST(SamplerBasics, TopKOneIsGreedy) {
  Sampler s;
  const float logits[] = {0.1f, 0.4f, 0.3f};
  const SamplingOptions o = options(1.0f, 1.0f, 1, 0);
  ASSERT_TRUE(s.prepare(row(logits, 3, o)).ok());
  for (double u : {0.0, 0.3, 0.999}) EXPECT_EQ(s.pick(u), 1);
}

TEST(SamplerBasics, FrequenciesFollowSoftmax) {
  // logits ln(1), ln(2), ln(5): probabilities 1/8, 2/8, 5/8 at temperature 1.
  Sampler s;
  const float logits[] = {0.0f, std::log(2.0f), std::log(5.0f)};
  const SamplingOptions o = options(1.0f, 1.0f, 0, 42);
  int counts[3] = {};
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[s.sample(row(logits, 3, o, i), nullptr).value()];
  EXPECT_NEAR(counts[0] / double(draws), 1.0 / 8, 0.01);
  EXPECT_NEAR(counts[1] / double(draws), 2.0 / 8, 0.01);
  EXPECT_NEAR(counts[2] / double(draws), 5.0 / 8, 0.01);
}

TEST(SamplerBasics, TopPKeepsTheSmallestPrefix) {
  // p = 5/8 reaches top_p 0.6 alone: only id 2 can be drawn.
  Sampler s;
  const float logits[] = {0.0f, std::log(2.0f), std::log(5.0f)};
  const SamplingOptions o = options(1.0f, 0.6f, 0, 1);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.sample(row(logits, 3, o, i), nullptr).value(), 2);
}

TEST(SamplerBasics, UniformIsDeterministicAndInRange) {
  EXPECT_EQ(sample_uniform(5, 17, 0), sample_uniform(5, 17, 0));
  EXPECT_NE(sample_uniform(5, 17, 0), sample_uniform(5, 18, 0));
  for (int i = 0; i < 1000; ++i) {
    const double u = sample_uniform(9, i, 0);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

// A NaN logit is an error, never a token: generate reports the row (not finite) before it
// samples, and serve fails the request.
TEST(SamplerBasics, NanLogitsAreRefused) {
  Sampler s;
  const float nan = NAN;
  const std::vector<float> logits = {nan, 1.0f, 3.0f, nan, 2.0f, nan, 0.5f, nan};
  for (const SamplingOptions& o : {options(0.0f, 1.0f, 0, 0), options(1.0f, 1.0f, 0, 0),
                                   options(2.0f, 0.9f, 3, 0)}) {
    const Result<int32_t> t = s.sample(row(logits.data(), 8, o), nullptr);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  }
  const std::vector<float> all_nan(16, nan);
  EXPECT_FALSE(s.sample(row(all_nan.data(), 16, options(1.0f, 0.5f, 0, 0)), nullptr).ok());
}

}  // namespace
}  // namespace xds::engine

#include "kernels/cpu/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace xds::kernels {
namespace {

TEST(Sampling, GreedyTakesLowestIdOnTiesAndRespectsValidVocab) {
  std::vector<std::pair<float, int32_t>> scratch;
  const float logits[] = {1.0f, 3.0f, 3.0f, 9.0f};
  SamplingParams greedy;
  EXPECT_EQ(sample_token(logits, 4, greedy, 0.5, scratch), 3);
  EXPECT_EQ(sample_token(logits, 3, greedy, 0.5, scratch), 1);  // id 3 is beyond the vocabulary
}

TEST(Sampling, TopKOneIsGreedy) {
  std::vector<std::pair<float, int32_t>> scratch;
  const float logits[] = {0.1f, 0.4f, 0.3f};
  SamplingParams p{1.0f, 1.0f, 1, 0};
  for (double u : {0.0, 0.3, 0.999}) EXPECT_EQ(sample_token(logits, 3, p, u, scratch), 1);
}

TEST(Sampling, FrequenciesFollowSoftmax) {
  // logits ln(1), ln(2), ln(5): probabilities 1/8, 2/8, 5/8 at temperature 1.
  std::vector<std::pair<float, int32_t>> scratch;
  const float logits[] = {0.0f, std::log(2.0f), std::log(5.0f)};
  SamplingParams p{1.0f, 1.0f, 0, 42};
  int counts[3] = {};
  const int draws = 40000;
  for (int i = 0; i < draws; ++i)
    ++counts[sample_token(logits, 3, p, sampling_uniform(42, i), scratch)];
  EXPECT_NEAR(counts[0] / double(draws), 1.0 / 8, 0.01);
  EXPECT_NEAR(counts[1] / double(draws), 2.0 / 8, 0.01);
  EXPECT_NEAR(counts[2] / double(draws), 5.0 / 8, 0.01);
}

TEST(Sampling, TopPKeepsTheSmallestPrefix) {
  // p = 5/8 reaches top_p 0.6 alone: only id 2 can be drawn.
  std::vector<std::pair<float, int32_t>> scratch;
  const float logits[] = {0.0f, std::log(2.0f), std::log(5.0f)};
  SamplingParams p{1.0f, 0.6f, 0, 1};
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(sample_token(logits, 3, p, sampling_uniform(1, i), scratch), 2);
}

TEST(Sampling, UniformIsDeterministicAndInRange) {
  EXPECT_EQ(sampling_uniform(5, 17), sampling_uniform(5, 17));
  EXPECT_NE(sampling_uniform(5, 17), sampling_uniform(5, 18));
  for (int i = 0; i < 1000; ++i) {
    const double u = sampling_uniform(9, i);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

// NaN logits rank below every number: never chosen while a number is left, and never
// undefined behaviour in the sort (std::sort's comparator must be a strict weak ordering).
TEST(Sampling, NanLogitsAreNeverChosenNorBreakTheSort) {
  const float nan = NAN;
  const std::vector<float> logits = {nan, 1.0f, 3.0f, nan, 2.0f, nan, 0.5f, nan};
  std::vector<std::pair<float, int32_t>> scratch;
  EXPECT_EQ(sample_token(logits.data(), 8, SamplingParams{0.0f, 1.0f, 0, 0}, 0.5, scratch), 2);
  for (int i = 0; i < 200; ++i) {
    const double u = (i + 0.5) / 200;
    for (const SamplingParams sp :
         {SamplingParams{1.0f, 1.0f, 0, 0}, SamplingParams{2.0f, 0.9f, 3, 0}}) {
      const int32_t t = sample_token(logits.data(), 8, sp, u, scratch);
      EXPECT_TRUE(t == 1 || t == 2 || t == 4 || t == 6) << t << " at u=" << u;
    }
  }
  const std::vector<float> all_nan(16, nan);  // nothing to prefer: a valid id, no crash
  const int32_t t =
      sample_token(all_nan.data(), 16, SamplingParams{1.0f, 0.5f, 0, 0}, 0.3, scratch);
  EXPECT_TRUE(t >= 0 && t < 16);
}

}  // namespace
}  // namespace xds::kernels

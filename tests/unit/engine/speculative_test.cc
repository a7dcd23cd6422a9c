// The speculative acceptance rule (engine/speculative.h): greedy cases worked out by hand,
// the penalties seeing the accepted drafts, the no-draft case against the sampler's own
// sample, and chi-square tests over a fixed seed set that the emitted tokens follow the
// processed distribution p whatever the drafts (the rule leaves the output distribution
// unchanged), with acceptance counts at their exact probabilities.
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace xds::engine {
namespace {

// Chi-square critical values at p = 0.001 for 1..9 degrees of freedom: a correct rule fails
// one of these comparisons with probability 1e-3, and the seed set is fixed, so the outcome
// is the same every run.
constexpr double kChi999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};
constexpr int kSeeds = 20000;

SamplingOptions greedy() {
  SamplingOptions o;
  o.temperature = 0.0f;
  return o;
}

SamplingOptions plain(uint64_t seed) {
  SamplingOptions o;
  o.temperature = 1.0f;
  o.seed = seed;
  return o;
}

// Rows [n, vocab] concatenated.
std::vector<float> rows(std::initializer_list<std::vector<float>> list) {
  std::vector<float> out;
  for (const auto& r : list) out.insert(out.end(), r.begin(), r.end());
  return out;
}

// ln p: at temperature 1 without top-k/top-p the sampler's processed distribution is p.
std::vector<float> log_row(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(x > 0 ? static_cast<float>(std::log(x)) : -INFINITY);
  return l;
}

SpecVerifyResult accept(Sampler& sampler, const std::vector<float>& logits, int64_t vocab,
                        const std::vector<int32_t>& drafts, const SamplingOptions& o,
                        std::span<const int32_t> output = {}, int64_t position = 7) {
  SpecVerifyInput in;
  in.logits = logits.data();
  in.row_stride = vocab;
  in.valid_vocab = vocab;
  in.drafts = drafts;
  in.options = &o;
  in.output = output;
  in.position = position;
  SpecVerifyResult r;
  const Status s = speculative_accept(sampler, in, r);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r;
}

double chi_square(const std::map<int32_t, int64_t>& counts, const std::vector<double>& p,
                  int64_t n) {
  double chi = 0;
  for (const auto& [id, c] : counts)
    EXPECT_GT(p.at(static_cast<size_t>(id)), 0.0) << "token " << id << " has probability 0";
  for (size_t id = 0; id < p.size(); ++id) {
    if (p[id] == 0) continue;
    const double e = p[id] * static_cast<double>(n);
    const auto it = counts.find(static_cast<int32_t>(id));
    const double o = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    chi += (o - e) * (o - e) / e;
  }
  return chi;
}

int nonzero(const std::vector<double>& p) {
  int n = 0;
  for (double x : p) n += x > 0;
  return n;
}

TEST(SpeculativeAccept, GreedyAcceptsWhileDraftsAreTheArgmax) {
  Sampler sampler;
  const int64_t v = 8;
  const std::vector<float> l = rows({{0, 1, 0, 0, 0, 3, 0, 0},    // argmax 5
                                     {0, 0, 4, 0, 0, 1, 0, 0},    // argmax 2
                                     {0, 0, 0, 0, 0, 0, 0, 2}});  // argmax 7
  const SamplingOptions o = greedy();
  SpecVerifyResult r = accept(sampler, l, v, {5, 2}, o);
  EXPECT_EQ(r.accepted, 2);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 2, 7}));
  r = accept(sampler, l, v, {5, 3}, o);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 2}));
  r = accept(sampler, l, v, {4, 2}, o);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5}));
  r = accept(sampler, l, v, {}, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5}));
  // A tie goes to the lower id: a draft of the higher one is rejected.
  const std::vector<float> tie = {0, 0, 3, 3};
  r = accept(sampler, tie, 4, {3}, o);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{2}));
}

TEST(SpeculativeAccept, OnlyTheValidVocabularyCanWin) {
  Sampler sampler;
  const std::vector<float> l = {1, 2, 0, 9};  // id 3 lies past the tokenizer's vocabulary
  const SamplingOptions o = greedy();
  SpecVerifyInput in;
  in.logits = l.data();
  in.row_stride = 4;
  in.valid_vocab = 3;
  in.options = &o;
  SpecVerifyResult r;
  ASSERT_TRUE(speculative_accept(sampler, in, r).ok());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1}));
  const std::vector<int32_t> bad = {3};
  in.drafts = bad;
  const Status s = speculative_accept(sampler, in, r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("draft 1 is id 3, outside [0, 3)"), std::string::npos) << s.message();
  in.drafts = {};
  in.row_stride = 2;
  EXPECT_FALSE(speculative_accept(sampler, in, r).ok());
  in.row_stride = 4;
  in.options = nullptr;
  EXPECT_FALSE(speculative_accept(sampler, in, r).ok());
}

TEST(SpeculativeAccept, PenaltiesOfALaterRowSeeTheAcceptedDrafts) {
  // Row 1 prefers 5 (3.0) over 2 (2.5); a frequency penalty of 1 on the accepted draft 5
  // makes it 2.0, so greedy row 1 picks 2. Without the penalty both drafts pass.
  Sampler sampler;
  const int64_t v = 6;
  const std::vector<float> l =
      rows({{0, 0, 0, 0, 0, 3}, {0, 0, 2.5f, 0, 0, 3}, {1, 0, 0, 0, 0, 0}});
  SamplingOptions o = greedy();
  SpecVerifyResult r = accept(sampler, l, v, {5, 5}, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 5, 0}));
  o.frequency_penalty = 1.0f;
  r = accept(sampler, l, v, {5, 5}, o);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 2}));
  // Output before the step counts too. With 5 generated once and a presence penalty of 1:
  // row 0 gives 5 3 - 1 - 1 = 1 > 0 (accepted); row 1 sees it twice, 3 - 2 - 1 = 0 < 2.5.
  // With a frequency penalty of 2, row 0 gives 5 3 - 2 - 1 = 0, tied with id 0: 0 wins.
  o.presence_penalty = 1.0f;
  const std::vector<int32_t> before = {5};
  r = accept(sampler, l, v, {5}, o, before);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 2}));
  o.frequency_penalty = 2.0f;
  r = accept(sampler, l, v, {5}, o, before);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{0}));
}

TEST(SpeculativeAccept, WithoutDraftsItIsTheSamplersOrdinarySample) {
  Sampler a, b;
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.15, 0.25};
  const std::vector<float> l = log_row(p);
  for (uint64_t seed = 0; seed < 300; ++seed) {
    SamplingOptions o = plain(seed);
    o.top_k = 4;
    o.top_p = 0.9f;
    const SpecVerifyResult r = accept(a, l, 5, {}, o, {}, 11);
    SampleInput in;
    in.logits = l.data();
    in.valid_vocab = 5;
    in.options = &o;
    in.position = 11;
    EXPECT_EQ(r.tokens[0], b.sample(in, nullptr).value()) << "seed " << seed;
  }
}

TEST(SpeculativeAccept, EmittedTokensFollowTheProcessedDistribution) {
  const std::vector<double> p = {0.05, 0.30, 0.10, 0.25, 0.20, 0.10};
  const std::vector<float> l = log_row(p);
  Sampler sampler;
  // A likely draft, an unlikely one, and the first token of two-draft runs.
  for (const int32_t draft : {1, 0, 4}) {
    std::map<int32_t, int64_t> counts;
    int64_t accepted = 0;
    for (int seed = 0; seed < kSeeds; ++seed) {
      const SpecVerifyResult r = accept(sampler, rows({l, l}), 6, {draft}, plain(seed));
      ++counts[r.tokens[0]];
      accepted += r.accepted;
    }
    EXPECT_LT(chi_square(counts, p, kSeeds), kChi999[nonzero(p) - 1]) << "draft " << draft;
    // Acceptance is Bernoulli(p(draft)): within 4 standard deviations.
    const double want = p[draft] * kSeeds, sd = std::sqrt(kSeeds * p[draft] * (1 - p[draft]));
    EXPECT_NEAR(static_cast<double>(accepted), want, 4 * sd) << "draft " << draft;
  }
}

TEST(SpeculativeAccept, TopKCutsTheDraftsAndTheResidualDraw) {
  // top_k 3 keeps {1, 3, 4}: p' = (0.3, 0.25, 0.2) / 0.75. A draft outside them is always
  // rejected and the residual is p'; a draft inside passes with p'(draft).
  const std::vector<double> p = {0.05, 0.30, 0.10, 0.25, 0.20, 0.10};
  const std::vector<double> kept = {0, 0.4, 0, 0.25 / 0.75, 0.2 / 0.75, 0};
  const std::vector<float> l = log_row(p);
  Sampler sampler;
  for (const int32_t draft : {5, 3}) {
    std::map<int32_t, int64_t> counts;
    int64_t accepted = 0;
    for (int seed = 0; seed < kSeeds; ++seed) {
      SamplingOptions o = plain(seed);
      o.top_k = 3;
      const SpecVerifyResult r = accept(sampler, rows({l, l}), 6, {draft}, o);
      ++counts[r.tokens[0]];
      accepted += r.accepted;
    }
    EXPECT_LT(chi_square(counts, kept, kSeeds), kChi999[nonzero(kept) - 1]) << "draft " << draft;
    if (draft == 5) {
      EXPECT_EQ(accepted, 0);
    }
  }
}

TEST(SpeculativeAccept, RunsOfTwoDraftsFollowEachRowsDistribution) {
  // Rows p0, p1, p2 differ. Drafts (1, 3): a = 0 w.p. 1 - p0(1), 1 w.p. p0(1)(1 - p1(3)),
  // 2 w.p. p0(1) p1(3); the second token, when draft 1 passed, follows p1; the third, when
  // both passed, follows p2.
  const std::vector<double> p0 = {0.1, 0.5, 0.1, 0.1, 0.2};
  const std::vector<double> p1 = {0.2, 0.1, 0.1, 0.4, 0.2};
  const std::vector<double> p2 = {0.3, 0.3, 0.2, 0.1, 0.1};
  const std::vector<float> l = rows({log_row(p0), log_row(p1), log_row(p2)});
  Sampler sampler;
  std::map<int32_t, int64_t> first, second, third, lengths;
  int64_t n_second = 0, n_third = 0;
  for (int seed = 0; seed < kSeeds; ++seed) {
    const SpecVerifyResult r = accept(sampler, l, 5, {1, 3}, plain(seed));
    ASSERT_EQ(r.tokens.size(), static_cast<size_t>(r.accepted + 1));
    ++lengths[static_cast<int32_t>(r.accepted)];
    ++first[r.tokens[0]];
    if (r.accepted >= 1) {
      ++second[r.tokens[1]];
      ++n_second;
    }
    if (r.accepted == 2) {
      ++third[r.tokens[2]];
      ++n_third;
    }
  }
  EXPECT_LT(chi_square(first, p0, kSeeds), kChi999[4]);
  EXPECT_LT(chi_square(second, p1, n_second), kChi999[4]);
  EXPECT_LT(chi_square(third, p2, n_third), kChi999[4]);
  const std::vector<double> len_p = {1 - p0[1], p0[1] * (1 - p1[3]), p0[1] * p1[3]};
  EXPECT_LT(chi_square(lengths, len_p, kSeeds), kChi999[2]);
}

TEST(SpeculativeAccept, EqualKeysGiveEqualResults) {
  const std::vector<double> p = {0.2, 0.2, 0.2, 0.2, 0.2};
  const std::vector<float> l = rows({log_row(p), log_row(p), log_row(p), log_row(p)});
  Sampler a, b;
  int differ_by_seed = 0, differ_by_position = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const SpecVerifyResult x = accept(a, l, 5, {1, 2, 3}, plain(seed), {}, 40);
    const SpecVerifyResult y = accept(b, l, 5, {1, 2, 3}, plain(seed), {}, 40);
    EXPECT_EQ(x.tokens, y.tokens) << "seed " << seed;
    const SpecVerifyResult z = accept(b, l, 5, {1, 2, 3}, plain(seed + 1000), {}, 40);
    const SpecVerifyResult w = accept(b, l, 5, {1, 2, 3}, plain(seed), {}, 41);
    differ_by_seed += z.tokens != x.tokens;
    differ_by_position += w.tokens != x.tokens;
  }
  EXPECT_GT(differ_by_seed, 50);
  EXPECT_GT(differ_by_position, 50);
}

}  // namespace
}  // namespace xds::engine

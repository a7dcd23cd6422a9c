// The sampler against plain references: argmax, hand-computed penalised rows, a sort-based
// top-k/top-p, a double-precision log_softmax, and chi-square tests of the draws over a fixed
// seed set (deterministic: the same seeds every run).
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace xds::engine {
namespace {

std::vector<float> random_row(int64_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> row(static_cast<size_t>(n));
  for (float& x : row) x = d(gen);
  return row;
}

// Plain reference of steps 4-5 (after penalties): probabilities of the kept ids, from a full
// sort by (logit desc, id asc), in long double.
std::map<int32_t, double> reference_distribution(const std::vector<float>& l, double t, int64_t k,
                                                 double p) {
  const int64_t v = static_cast<int64_t>(l.size());
  std::vector<int32_t> ids(static_cast<size_t>(v));
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (k <= 0 || k > v) k = v;
  ids.resize(static_cast<size_t>(k));
  const long double mx = l[ids[0]];
  std::vector<long double> w;
  long double z = 0;
  for (int32_t id : ids) {
    w.push_back(std::exp((l[id] - mx) / static_cast<long double>(t)));
    z += w.back();
  }
  size_t cut = ids.size();
  long double cum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cum += w[i];
    if (cum / z >= p - 1e-12L) {
      cut = i + 1;
      break;
    }
  }
  long double kept = 0;
  for (size_t i = 0; i < cut; ++i) kept += w[i];
  std::map<int32_t, double> out;
  for (size_t i = 0; i < cut; ++i) out[ids[i]] = static_cast<double>(w[i] / kept);
  return out;
}

// Chi-square of `counts` against `expected` probabilities over n draws; tokens outside
// `expected` must never be drawn.
double chi_square(const std::map<int32_t, int64_t>& counts,
                  const std::map<int32_t, double>& expected, int64_t n) {
  double chi = 0.0;
  for (const auto& [id, c] : counts)
    EXPECT_TRUE(expected.count(id)) << "token " << id << " was cut";
  for (const auto& [id, p] : expected) {
    const double e = p * static_cast<double>(n);
    const auto it = counts.find(id);
    const double o = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    chi += (o - e) * (o - e) / e;
  }
  return chi;
}

// Chi-square critical values at p = 0.001 for 1..9 degrees of freedom.
constexpr double kChi999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};

TEST(SamplerUniform, InRangeAndKeyedByAllThree) {
  double sum = 0.0;
  std::vector<int64_t> bins(10, 0);
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = sample_uniform(1234, i, 0);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++bins[static_cast<size_t>(u * 10)];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  double chi = 0.0;
  for (int64_t b : bins) chi += (b - n / 10.0) * (b - n / 10.0) / (n / 10.0);
  EXPECT_LT(chi, kChi999[9]);
  EXPECT_EQ(sample_uniform(7, 3, 1), sample_uniform(7, 3, 1));
  EXPECT_NE(sample_uniform(7, 3, 1), sample_uniform(8, 3, 1));
  EXPECT_NE(sample_uniform(7, 3, 1), sample_uniform(7, 4, 1));
  EXPECT_NE(sample_uniform(7, 3, 1), sample_uniform(7, 3, 2));
}

TEST(Sampler, GreedyIsArgmaxWithTiesToLowerId) {
  Sampler s;
  SamplingOptions o;
  o.temperature = 0.0f;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto row = random_row(500, seed);
    const int64_t valid = 400;  // the row's tail can never win
    int64_t best = 0;
    for (int64_t i = 1; i < valid; ++i)
      if (row[i] > row[best]) best = i;
    auto r = s.sample({.logits = row.data(), .valid_vocab = valid, .options = &o}, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, best);
  }
  std::vector<float> tie = {0.0f, 5.0f, 1.0f, 5.0f, 9.0f};
  auto r = s.sample({.logits = tie.data(), .valid_vocab = 4, .options = &o}, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 1);
}

// Row, prompt and output chosen so that every rule shows; processed by hand:
//   id 0: in prompt, 2.0 > 0 -> 2.0 / 2 = 1.0
//   id 1: output once, -1.0 * 2 = -2.0, - (0.5 * 1 + 0.25) = -2.75
//   id 2: untouched 0.5
//   id 3: output twice, 3.0 / 2 = 1.5, - (0.5 * 2 + 0.25) = 0.25
//   id 4: in prompt, -2.0 * 2 = -4.0
//   id 5: untouched 0.0
//   id 6: beyond valid_vocab (present in output: ignored)
const std::vector<float> kPenaltyRow = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f, 50.0f};
const std::vector<int32_t> kPrompt = {0, 4, 4};
const std::vector<int32_t> kOutput = {3, 1, 3, 6};
const std::vector<float> kPenalised = {1.0f, -2.75f, 0.5f, 0.25f, -4.0f, 0.0f};

SamplingOptions penalty_options(float t) {
  SamplingOptions o;
  o.temperature = t;
  o.repetition_penalty = 2.0f;
  o.frequency_penalty = 0.5f;
  o.presence_penalty = 0.25f;
  return o;
}

SampleInput penalty_input(const SamplingOptions& o) {
  return {.logits = kPenaltyRow.data(),
          .valid_vocab = 6,
          .options = &o,
          .prompt = kPrompt,
          .output = kOutput};
}

TEST(Sampler, PenaltiesMatchHandComputedRow) {
  Sampler s;
  const SamplingOptions greedy = penalty_options(0.0f);
  auto r = s.sample(penalty_input(greedy), nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0);  // raw argmax is 3; penalised it is 0
  for (float t : {1.0f, 0.5f}) {
    const SamplingOptions o = penalty_options(t);
    ASSERT_TRUE(s.prepare(penalty_input(o)).ok());
    const auto ref = reference_distribution(kPenalised, t, 0, 1.0);
    for (int32_t id = 0; id < 6; ++id)
      EXPECT_NEAR(s.probability(id), ref.at(id), 1e-6) << "t " << t << " id " << id;
    EXPECT_EQ(s.probability(6), 0.0);
  }
  // Repetition penalty alone leaves output counts out of it: id 3 -> 1.5, id 1 -> -2.
  SamplingOptions rep;
  rep.repetition_penalty = 2.0f;
  ASSERT_TRUE(s.prepare(penalty_input(rep)).ok());
  const auto ref = reference_distribution({1.0f, -2.0f, 0.5f, 1.5f, -4.0f, 0.0f}, 1.0, 0, 1.0);
  for (int32_t id = 0; id < 6; ++id) EXPECT_NEAR(s.probability(id), ref.at(id), 1e-6);
  // Penalties never leak into the next call (the scratch counts are cleared).
  SamplingOptions plain;
  ASSERT_TRUE(s.prepare(penalty_input(plain)).ok());
  std::vector<float> raw(kPenaltyRow.begin(), kPenaltyRow.begin() + 6);
  const auto ref_raw = reference_distribution(raw, 1.0, 0, 1.0);
  for (int32_t id = 0; id < 6; ++id) EXPECT_NEAR(s.probability(id), ref_raw.at(id), 1e-6);
}

TEST(Sampler, TopKTopPCutMatchesSortReference) {
  Sampler s;
  struct Case {
    int64_t vocab;
    float t;
    int32_t k;
    float p;
  };
  const Case cases[] = {{50, 1.0f, 5, 1.0f},    {50, 0.7f, 0, 0.9f},  {50, 1.3f, 10, 0.5f},
                        {50, 1.0f, 1, 0.3f},    {50, 1.0f, 49, 1.0f}, {50, 1.0f, 60, 0.99f},
                        {3000, 2.0f, 0, 0.95f},  // the growing window is needed
                        {3000, 1.0f, 200, 0.8f}};
  uint32_t seed = 100;
  for (const Case& c : cases) {
    auto row = random_row(c.vocab, seed++, c.vocab > 100 ? 0.5f : 3.0f);
    row[7] = row[9];  // a tie
    SamplingOptions o;
    o.temperature = c.t;
    o.top_k = c.k;
    o.top_p = c.p;
    ASSERT_TRUE(s.prepare({.logits = row.data(), .valid_vocab = c.vocab, .options = &o}).ok());
    const auto ref = reference_distribution(row, c.t, c.k, c.p);
    ASSERT_EQ(s.candidates().size(), ref.size())
        << "vocab " << c.vocab << " k " << c.k << " p " << c.p;
    for (const auto& [id, prob] : ref) EXPECT_NEAR(s.probability(id), prob, 1e-9);
  }
}

// Draws with seeds 0..n-1 at one position: the histogram must match the processed
// distribution.
void expect_histogram(Sampler& s, const std::vector<float>& row, const SamplingOptions& base,
                      std::span<const int32_t> prompt, std::span<const int32_t> output,
                      const std::map<int32_t, double>& expected) {
  const int64_t n = 20000;
  std::map<int32_t, int64_t> counts;
  SamplingOptions o = base;
  for (int64_t i = 0; i < n; ++i) {
    o.seed = static_cast<uint64_t>(i) * 7919u + 1;
    auto r = s.sample({.logits = row.data(),
                       .valid_vocab = static_cast<int64_t>(row.size()),
                       .options = &o,
                       .prompt = prompt,
                       .output = output,
                       .position = 17},
                      nullptr);
    ASSERT_TRUE(r.ok());
    ++counts[*r];
  }
  ASSERT_GE(expected.size(), 2u);
  ASSERT_LE(expected.size(), 10u);
  EXPECT_LT(chi_square(counts, expected, n), kChi999[expected.size() - 1]);
}

TEST(Sampler, HistogramMatchesProcessedDistribution) {
  Sampler s;
  // Penalties + temperature over the whole row.
  const std::vector<float> row(kPenaltyRow.begin(), kPenaltyRow.begin() + 6);
  expect_histogram(s, row, penalty_options(0.8f), kPrompt, kOutput,
                   reference_distribution(kPenalised, 0.8, 0, 1.0));
  // Top-k and top-p cuts.
  const std::vector<float> row2 = {1.0f, 0.2f, 2.0f, -0.5f, 1.5f, 0.9f, -3.0f, 0.0f};
  SamplingOptions o;
  o.temperature = 1.2f;
  o.top_k = 5;
  expect_histogram(s, row2, o, {}, {}, reference_distribution(row2, 1.2, 5, 1.0));
  o.top_k = 0;
  o.top_p = 0.8f;
  expect_histogram(s, row2, o, {}, {}, reference_distribution(row2, 1.2, 0, 0.8));
}

TEST(Sampler, PickExcludingRenormalisesTheRest) {
  Sampler s;
  const std::vector<float> row = {1.0f, 0.0f, 2.0f, 0.5f};
  SamplingOptions o;
  ASSERT_TRUE(s.prepare({.logits = row.data(), .valid_vocab = 4, .options = &o}).ok());
  auto ref = reference_distribution(row, 1.0, 0, 1.0);
  const double px = ref.at(2);
  ref.erase(2);
  for (auto& [id, p] : ref) p /= 1.0 - px;
  std::map<int32_t, int64_t> counts;
  const int64_t n = 20000;
  for (int64_t i = 0; i < n; ++i) ++counts[s.pick_excluding(2, sample_uniform(5, i, 1))];
  EXPECT_LT(chi_square(counts, ref, n), kChi999[2]);
  // Greedy: the one candidate holds all the mass.
  o.temperature = 0.0f;
  ASSERT_TRUE(s.prepare({.logits = row.data(), .valid_vocab = 4, .options = &o}).ok());
  EXPECT_EQ(s.pick_excluding(2, 0.5), 2);
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  Sampler s;
  const auto row = random_row(1000, 77);
  // Double-precision reference.
  long double mx = row[0];
  for (float x : row) mx = std::max<long double>(mx, x);
  long double z = 0;
  for (float x : row) z += std::exp(static_cast<long double>(x) - mx);
  const long double lse = mx + std::log(z);
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });

  SamplingOptions o = penalty_options(0.7f);  // processing must not change the logprobs
  o.top_k = 20;
  o.logprobs = 5;
  const std::vector<int32_t> out = {ids[0], ids[0], ids[1]};
  TokenLogprob lp;
  auto r = s.sample(
      {.logits = row.data(), .valid_vocab = 1000, .options = &o, .output = out, .position = 3},
      &lp);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(lp.token, *r);
  EXPECT_NEAR(lp.logprob, static_cast<double>(row[*r] - lse), 1e-5);
  ASSERT_EQ(lp.top.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].first, ids[i]);
    EXPECT_NEAR(lp.top[i].second, static_cast<double>(row[ids[i]] - lse), 1e-5);
  }
  o.logprobs = 0;  // the chosen token only
  ASSERT_TRUE(s.sample({.logits = row.data(), .valid_vocab = 1000, .options = &o}, &lp).ok());
  EXPECT_TRUE(lp.top.empty());
}

TEST(Sampler, TokenDependsOnlyOnSeedAndPosition) {
  const auto row_a = random_row(300, 1, 1.0f);
  SamplingOptions a;
  a.temperature = 0.9f;
  a.top_p = 0.95f;
  a.seed = 42;
  const std::vector<int32_t> out_a = {5, 6, 7};
  std::vector<int32_t> alone;
  {
    Sampler s;
    for (int64_t pos = 10; pos < 40; ++pos) {
      auto r = s.sample({.logits = row_a.data(),
                         .valid_vocab = 300,
                         .options = &a,
                         .output = out_a,
                         .position = pos},
                        nullptr);
      ASSERT_TRUE(r.ok());
      alone.push_back(*r);
    }
  }
  // Same requests, now interleaved with others of different sizes and options ("the batch").
  Sampler s;
  std::vector<int32_t> batched;
  for (int64_t pos = 10; pos < 40; ++pos) {
    const auto other = random_row(500 + pos, static_cast<uint32_t>(pos), 2.0f);
    SamplingOptions b = penalty_options(1.5f);
    b.top_k = static_cast<int32_t>(pos);
    b.seed = static_cast<uint64_t>(pos);
    const std::vector<int32_t> out_b = {1, 2, 2, 3};
    ASSERT_TRUE(s.sample({.logits = other.data(),
                          .valid_vocab = 500 + pos,
                          .options = &b,
                          .prompt = out_b,
                          .output = out_b,
                          .position = pos},
                         nullptr)
                    .ok());
    auto r = s.sample({.logits = row_a.data(),
                       .valid_vocab = 300,
                       .options = &a,
                       .output = out_a,
                       .position = pos},
                      nullptr);
    ASSERT_TRUE(r.ok());
    batched.push_back(*r);
  }
  EXPECT_EQ(alone, batched);
  // And the draws do move with the position (not one token repeated).
  EXPECT_GT(std::set<int32_t>(alone.begin(), alone.end()).size(), 3u);
}

TEST(Sampler, BadInputIsAClearError) {
  Sampler s;
  SamplingOptions o;
  std::vector<float> row = {0.0f, 1.0f, 2.0f, NAN};
  auto r = s.sample({.logits = row.data(), .valid_vocab = 4, .options = &o}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token 3"), std::string::npos) << r.status().message();
  EXPECT_TRUE(s.sample({.logits = row.data(), .valid_vocab = 3, .options = &o}, nullptr).ok());
  row = {-INFINITY, -INFINITY};
  EXPECT_FALSE(s.sample({.logits = row.data(), .valid_vocab = 2, .options = &o}, nullptr).ok());
  EXPECT_FALSE(s.sample({.logits = nullptr, .valid_vocab = 2, .options = &o}, nullptr).ok());
  row = {0.0f, 1.0f};
  EXPECT_FALSE(s.sample({.logits = row.data(), .valid_vocab = 0, .options = &o}, nullptr).ok());
  EXPECT_FALSE(
      s.sample({.logits = row.data(), .valid_vocab = 2, .options = nullptr}, nullptr).ok());
  for (auto bad :
       {+[](SamplingOptions& x) { x.top_p = 0.0f; }, +[](SamplingOptions& x) { x.top_p = 1.5f; },
        +[](SamplingOptions& x) { x.temperature = -1.0f; },
        +[](SamplingOptions& x) { x.temperature = NAN; }, +[](SamplingOptions& x) { x.top_k = -2; },
        +[](SamplingOptions& x) { x.repetition_penalty = 0.0f; }}) {
    SamplingOptions b;
    bad(b);
    auto e = s.sample({.logits = row.data(), .valid_vocab = 2, .options = &b}, nullptr);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  }
  // -inf entries are fine (masked tokens) and never drawn.
  row = {-INFINITY, 1.0f, -INFINITY};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    o.seed = seed;
    auto ok = s.sample({.logits = row.data(), .valid_vocab = 3, .options = &o}, nullptr);
    ASSERT_TRUE(ok.ok());
    EXPECT_EQ(*ok, 1);
  }
}

}  // namespace
}  // namespace xds::engine

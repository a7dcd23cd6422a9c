// The workload: arrival processes against their definitions (exponential gaps' mean and tail,
// periodic times), lengths in range and with their weights, the text syntax and its errors.
#include "loadgen/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace xds::loadgen {
namespace {

LengthDist fixed(int64_t n) {
  LengthDist d;
  d.lo = d.hi = n;
  return d;
}

WorkloadSpec poisson(double rate, int64_t n, uint64_t seed) {
  WorkloadSpec w;
  RequestClass c;
  c.arrival = ArrivalKind::kPoisson;
  c.rate = rate;
  c.input = fixed(8);
  c.output = fixed(4);
  w.classes = {c};
  w.num_requests = n;
  w.seed = seed;
  return w;
}

TEST(Rng, SplitMix64ReferenceSequence) {
  // SplitMix64 from seed 0: the published first outputs of the reference implementation.
  Rng rng(0);
  EXPECT_EQ(rng.next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.next(), 0x06c45d188009454fULL);
}

TEST(Rng, UniformIntCoversTheRangeEvenly) {
  Rng rng(7);
  std::map<int64_t, int> counts;
  const int n = 60000;
  for (int i = 0; i < n; ++i) ++counts[rng.uniform_int(-3, 3)];
  ASSERT_EQ(counts.size(), 6u);
  EXPECT_EQ(counts.begin()->first, -3);
  EXPECT_EQ(counts.rbegin()->first, 2);
  // Each value expects 10000 with a standard deviation of ~91: 5% is over 5 sigma.
  for (const auto& [v, c] : counts) EXPECT_NEAR(c, 10000, 500) << v;
}

TEST(Arrivals, PoissonGapsHaveMeanOneOverRateAndAnExponentialTail) {
  const double rate = 4.0;
  const int64_t n = 20000;
  auto arrivals = open_loop_arrivals(poisson(rate, n, 12345));
  ASSERT_TRUE(arrivals.ok()) << arrivals.status().to_string();
  ASSERT_EQ(static_cast<int64_t>(arrivals->size()), n);
  double prev = 0, sum = 0;
  int64_t above_mean = 0;
  for (const Arrival& a : *arrivals) {
    const double gap = a.time_s - prev;
    ASSERT_GE(gap, 0.0);
    sum += gap;
    if (gap > 1.0 / rate) ++above_mean;
    prev = a.time_s;
  }
  // Mean 0.25 s; its standard error over 20000 gaps is 0.25 / sqrt(20000) = 0.0018.
  EXPECT_NEAR(sum / n, 0.25, 0.01);
  // P(gap > mean) = e^-1 = 0.3679 for an exponential; standard error ~0.0034.
  EXPECT_NEAR(static_cast<double>(above_mean) / n, std::exp(-1.0), 0.02);
}

TEST(Arrivals, SameSeedSameArrivalsOtherSeedOthers) {
  auto a = open_loop_arrivals(poisson(2.0, 50, 1));
  auto b = open_loop_arrivals(poisson(2.0, 50, 1));
  auto c = open_loop_arrivals(poisson(2.0, 50, 2));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].time_s, (*b)[i].time_s);
  EXPECT_NE((*a)[0].time_s, (*c)[0].time_s);
}

TEST(Arrivals, MixMergesPeriodicAndPoissonInTimeOrderWithinTheDuration) {
  auto mix = parse_mix("rate=1,in=128,out=64; period=60,start=5,in=3900,out=32");
  ASSERT_TRUE(mix.ok()) << mix.status().to_string();
  WorkloadSpec w;
  w.classes = *mix;
  w.duration_s = 180;
  auto arrivals = open_loop_arrivals(w);
  ASSERT_TRUE(arrivals.ok()) << arrivals.status().to_string();
  std::vector<double> periodic;
  int64_t short_ones = 0;
  double prev = 0;
  for (const Arrival& a : *arrivals) {
    EXPECT_GE(a.time_s, prev);
    EXPECT_LT(a.time_s, 180.0);
    prev = a.time_s;
    if (a.class_id == 1)
      periodic.push_back(a.time_s);
    else
      ++short_ones;
  }
  EXPECT_EQ(periodic, (std::vector<double>{5, 65, 125}));
  // 180 expected at rate 1 over 180 s; standard deviation sqrt(180) = 13.4.
  EXPECT_NEAR(static_cast<double>(short_ones), 180.0, 60.0);
}

TEST(Arrivals, NumRequestsCutsTheMergedStream) {
  auto mix = parse_mix("rate=5,in=8,out=8;period=1,in=8,out=8");
  ASSERT_TRUE(mix.ok());
  WorkloadSpec w;
  w.classes = *mix;
  w.num_requests = 37;
  auto arrivals = open_loop_arrivals(w);
  ASSERT_TRUE(arrivals.ok());
  EXPECT_EQ(arrivals->size(), 37u);
}

TEST(Lengths, ParseAndSampleInRange) {
  auto u = parse_length_dist("64-256", "--input-len-dist");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->kind, LengthDist::Kind::kUniform);
  Rng rng(3);
  bool saw_lo = false, saw_hi = false;
  for (int i = 0; i < 20000; ++i) {
    const int64_t n = sample_length(*u, rng);
    ASSERT_GE(n, 64);
    ASSERT_LE(n, 256);
    saw_lo |= n == 64;
    saw_hi |= n == 256;
  }
  EXPECT_TRUE(saw_lo && saw_hi);  // both ends included

  auto w = parse_length_dist("10:3/20:1", "--output-len-dist");
  ASSERT_TRUE(w.ok());
  int tens = 0;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    const int64_t v = sample_length(*w, rng);
    ASSERT_TRUE(v == 10 || v == 20);
    tens += v == 10;
  }
  EXPECT_NEAR(static_cast<double>(tens) / n, 0.75, 0.02);  // 3 / (3 + 1); sd 0.002
  EXPECT_EQ(max_length(*w), 20);
  EXPECT_EQ(length_dist_string(*w), "10:3/20:1");

  auto f = parse_length_dist(" 128 ", "--input-len");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(sample_length(*f, rng), 128);
}

TEST(Lengths, BadTextNamesTheFlagAndTheValue) {
  for (const char* bad : {"", "abc", "0", "-5", "10-5", "10:0", "10:x", "1:1/", "5-"}) {
    auto r = parse_length_dist(bad, "--input-len-dist");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--input-len-dist"), std::string::npos) << bad;
  }
}

TEST(Mix, BadTextIsRefused) {
  for (const char* bad : {"", "rate=1,in=8", "rate=1,period=2,in=8,out=8", "in=8,out=8",
                          "rate=0,in=8,out=8", "rate=1,in=8,out=8,color=red", "rate=1;in=8"}) {
    EXPECT_FALSE(parse_mix(bad).ok()) << bad;
  }
}

TEST(Requests, TokenIdsInRangeAndDeterministicPerIndex) {
  WorkloadSpec w = poisson(1.0, 10, 99);
  auto in = parse_length_dist("16-32", "in");
  ASSERT_TRUE(in.ok());
  w.classes[0].input = *in;
  w.prompt.id_lo = 100;
  w.prompt.id_hi = 110;
  for (int64_t i = 0; i < 50; ++i) {
    const RequestSpec r = make_request(w, 0, i, 0.0);
    ASSERT_GE(r.input_len, 16);
    ASSERT_LE(r.input_len, 32);
    ASSERT_EQ(static_cast<int64_t>(r.prompt_ids.size()), r.input_len);
    EXPECT_EQ(r.output_len, 4);
    for (int32_t id : r.prompt_ids) {
      ASSERT_GE(id, 100);
      ASSERT_LT(id, 110);
    }
    EXPECT_EQ(make_request(w, 0, i, 1.0).prompt_ids, r.prompt_ids);
  }
  EXPECT_NE(make_request(w, 0, 0, 0).prompt_ids, make_request(w, 0, 1, 0).prompt_ids);
}

TEST(Requests, TextPromptHasInputLenWords) {
  WorkloadSpec w = poisson(1.0, 10, 5);
  w.prompt.token_ids = false;
  w.classes[0].input = fixed(12);
  const RequestSpec r = make_request(w, 0, 3, 0.0);
  EXPECT_TRUE(r.prompt_ids.empty());
  int spaces = 0;
  for (char ch : r.prompt_text) spaces += ch == ' ';
  EXPECT_EQ(spaces, 11);
}

TEST(Requests, GivenPromptsAreUsedInTurn) {
  WorkloadSpec w = poisson(1.0, 10, 5);
  w.prompt.token_ids = false;
  w.prompt.texts = {"In the beginning", "And God said", "Blessed is the man"};
  for (int64_t i = 0; i < 7; ++i) {
    EXPECT_EQ(make_request(w, 0, i, 0.0).prompt_text, w.prompt.texts[static_cast<size_t>(i % 3)]);
  }
}

TEST(Validate, RefusesUnboundedAndBadSpecs) {
  WorkloadSpec w = poisson(1.0, 0, 1);
  EXPECT_FALSE(validate_workload(w).ok());  // neither a count nor a duration
  w.duration_s = 10;
  EXPECT_TRUE(validate_workload(w).ok());
  w.prompt.id_hi = w.prompt.id_lo;
  EXPECT_FALSE(validate_workload(w).ok());
  WorkloadSpec closed;
  closed.classes = {RequestClass{}};
  closed.classes[0].input = fixed(4);
  closed.classes[0].output = fixed(4);
  closed.num_requests = 5;
  closed.concurrency = 0;
  EXPECT_FALSE(validate_workload(closed).ok());
  closed.concurrency = 2;
  EXPECT_TRUE(validate_workload(closed).ok());
  EXPECT_FALSE(open_loop_arrivals(closed).ok());
}

}  // namespace
}  // namespace xds::loadgen

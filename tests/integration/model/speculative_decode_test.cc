// MTP speculative decoding's bookkeeping (model/speculative_decode.h), run by a one-sequence
// reference loop (mtp_reference_decoder.h) with plain and scripted acceptance, against
// independent computations: plain one-token greedy decoding (the output with speculation must be the
// same wherever the plain run's top-1 margin exceeds the numerics contract), a fresh
// computation over the accepted tokens (rollback), drafts computed from scratch by direct
// forward / forward_mtp calls (draft-extend), and the stop / max_tokens cuts against an
// uncut run. (forward_mtp's hidden output against the head applied by hand: kjv_mtp_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/speculative_decode.h"
#include "mtp_reference_decoder.h"
#include "test_models.h"

namespace xds {
namespace {

using mtp_reference::mtp_spec_cut;
using mtp_reference::MtpSpecAcceptFn;
using mtp_reference::MtpSpecCut;
using mtp_reference::MtpSpecDecodeOptions;
using mtp_reference::MtpSpecDecoder;
using mtp_reference::MtpSpecRows;
using mtp_reference::MtpSpecStats;

// The numerics contract of the f32 mode: a row within 1e-4 of its largest |logit| of the
// float64 oracle (docs/design/architecture.md, "Numerics"); two f32 runs of the same row are
// then within twice that, and their argmax can differ only where the top-2 margin is below it.
constexpr double kRowTol = 2e-4;

std::string shipped_dir() {
  return std::string(XDS_SOURCE_DIR) + "/models/kjv-moe-tiny";
}

using fixtures::load_deepseek;

// A random tiny checkpoint with `mtp_layers` MTP layers, in a directory of its own per test.
std::string tiny_dir(const std::string& name, int mtp_layers, uint64_t seed) {
  return fixtures::random_checkpoint("spec_" + name, seed, mtp_layers);
}

// Prompts of real text: the first `n` tokens of the recipe's conformance sequences.
std::vector<int32_t> kjv_prompt(int64_t row, int64_t n) {
  const std::string path =
      std::string(XDS_SOURCE_DIR) + "/tests/conformance/kjv_moe_tiny/tokens.i32";
  std::vector<int32_t> all(3 * 64);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
  EXPECT_TRUE(f.good()) << path;
  return std::vector<int32_t>(all.begin() + row * 64, all.begin() + row * 64 + n);
}

int32_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}

// Top-1 minus top-2 over the row's largest |logit|.
double relative_margin(const float* row, int64_t n) {
  double a = -INFINITY, b = -INFINITY, mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = row[i];
    mx = std::max(mx, std::fabs(v));
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return (a - b) / std::max(mx, 1e-30);
}

double max_abs(const float* row, int64_t n) {
  double mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, std::fabs(double(row[i])));
  return mx;
}

// Greedy acceptance, written here: drafts pass while each equals its row's argmax.
MtpSpecAcceptFn greedy_accept(int64_t vocab) {
  return [vocab](const MtpSpecRows& in, std::vector<int32_t>& tokens) -> Status {
    const float* logits = in.logits;
    const std::span<const int32_t> drafts = in.drafts;
    for (size_t r = 0; r <= drafts.size(); ++r) {
      const int32_t best = argmax(logits + r * vocab, vocab);
      tokens.push_back(best);
      if (r == drafts.size() || drafts[r] != best) return {};
    }
    return {};
  };
}

// Accepts a scripted number of drafts per call (cycling through `pattern`, capped by the
// drafts there are), then the argmax of the next row: every acceptance length is exercised
// whatever the MTP head proposes.
MtpSpecAcceptFn scripted_accept(int64_t vocab, std::vector<int64_t> pattern) {
  auto calls = std::make_shared<size_t>(0);
  return [vocab, pattern, calls](const MtpSpecRows& in, std::vector<int32_t>& tokens) -> Status {
    const float* logits = in.logits;
    const std::span<const int32_t> drafts = in.drafts;
    const int64_t a = std::min<int64_t>(pattern[(*calls)++ % pattern.size()],
                                        static_cast<int64_t>(drafts.size()));
    for (int64_t r = 0; r < a; ++r) tokens.push_back(drafts[r]);
    tokens.push_back(argmax(logits + a * vocab, vocab));
    return {};
  };
}

MtpSpecDecodeOptions decode_options(const DeepseekV3Model& m, int64_t k, int64_t layers,
                                    int64_t max_tokens) {
  MtpSpecDecodeOptions o;
  o.spec = mtp_spec_config(k, layers, m.config().num_nextn_predict_layers).value();
  o.max_tokens = max_tokens;
  o.max_length = m.config().max_position_embeddings;
  o.valid_vocab = m.config().vocab_size;
  return o;
}

// Plain greedy decoding, one token per step, with each step's relative margin.
struct Plain {
  std::vector<int32_t> output;
  std::vector<double> margin;  // [output] of the row each token came from
};
Plain plain_greedy(DeepseekV3Model& m, std::span<const int32_t> prompt, int64_t max_tokens) {
  const int64_t v = m.config().vocab_size, n = static_cast<int64_t>(prompt.size());
  KvCache cache = m.make_cache(n + max_tokens + 16).value();
  const int64_t seq = cache.add_sequence();
  StepOutput out;
  TokenChunk tc = cache.chunk(seq, 0, prompt).value();
  EXPECT_TRUE(m.forward({&tc, 1}, cache.storage(), out).ok());
  Plain p;
  for (int64_t i = 0; i < max_tokens; ++i) {
    p.output.push_back(argmax(out.logits.data(), v));
    p.margin.push_back(relative_margin(out.logits.data(), v));
    if (i + 1 == max_tokens) break;
    tc = cache.chunk(seq, n + i, std::span<const int32_t>(&p.output.back(), 1)).value();
    EXPECT_TRUE(m.forward({&tc, 1}, cache.storage(), out).ok());
  }
  return p;
}

struct SpecRun {
  std::vector<int32_t> output;
  std::vector<size_t> step_sizes;  // tokens emitted by the prefill and each step
  MtpSpecStats stats;
};
SpecRun spec_run(DeepseekV3Model& m, std::span<const int32_t> prompt, const MtpSpecDecodeOptions& o,
                 MtpSpecAcceptFn accept) {
  KvCache cache = m.make_cache(static_cast<int64_t>(prompt.size()) + o.max_tokens + 32).value();
  MtpSpecDecoder dec(m, cache, cache.add_sequence(), o, std::move(accept));
  EXPECT_TRUE(dec.prefill(prompt).ok());
  SpecRun r;
  r.step_sizes.push_back(dec.last_emitted().size());
  while (!dec.finished()) {
    const Status s = dec.step();
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) break;
    r.step_sizes.push_back(dec.last_emitted().size());
  }
  r.output.assign(dec.output().begin(), dec.output().end());
  r.stats = dec.stats();
  return r;
}

// The plain run's tokens are comparable up to the first one whose row had a margin inside
// the contract (past it, either token is a correct greedy choice).
size_t comparable_prefix(const Plain& p) {
  size_t n = 0;
  while (n < p.margin.size() && p.margin[n] > kRowTol) ++n;
  return n;
}

TEST(SpeculativeDecode, GreedyOutputEqualsPlainDecodingOnTheShippedModel) {
  const auto m = load_deepseek(shipped_dir());
  ASSERT_NE(m, nullptr);
  const int64_t v = m->config().vocab_size, max_tokens = 40;
  size_t compared = 0;
  int64_t accepted = 0;
  for (const auto& [row, len] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 12}, {1, 20}, {2, 31}}) {
    const std::vector<int32_t> prompt = kjv_prompt(row, len);
    const Plain plain = plain_greedy(*m, prompt, max_tokens);
    const size_t n = comparable_prefix(plain);
    compared += n;
    for (const int64_t k : {1, 2, 3}) {
      const SpecRun r =
          spec_run(*m, prompt, decode_options(*m, k, 0, max_tokens), greedy_accept(v));
      ASSERT_EQ(r.output.size(), static_cast<size_t>(max_tokens)) << "k " << k;
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(r.output[i], plain.output[i]) << "prompt " << row << " k " << k << " token " << i;
      for (const int64_t a : r.stats.accepted_at) accepted += a;
      // Each step gave its accepted drafts plus one token.
      int64_t drafts_accepted = 0;
      for (const int64_t a : r.stats.accepted_at) drafts_accepted += a;
      EXPECT_EQ(r.stats.step_tokens, r.stats.steps + drafts_accepted);
    }
  }
  EXPECT_GE(compared, 60u) << "too few tokens with a safe margin to compare";
  EXPECT_GT(accepted, 0) << "no draft was ever accepted";
}

TEST(SpeculativeDecode, GreedyOutputEqualsPlainDecodingWithSeveralMtpLayers) {
  const auto m = load_deepseek(tiny_dir("three_layers_greedy", 3, 7));
  ASSERT_NE(m, nullptr);
  const int64_t v = m->config().vocab_size, max_tokens = 24;
  size_t compared = 0;
  for (const uint32_t seed : {1u, 2u}) {
    const std::vector<int32_t> prompt = fixtures::random_ids(10 + seed, v, seed);
    const Plain plain = plain_greedy(*m, prompt, max_tokens);
    const size_t n = comparable_prefix(plain);
    compared += n;
    for (const auto& [k, layers] :
         std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {3, 3}, {4, 2}}) {
      const SpecRun r =
          spec_run(*m, prompt, decode_options(*m, k, layers, max_tokens), greedy_accept(v));
      ASSERT_EQ(r.output.size(), static_cast<size_t>(max_tokens));
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(r.output[i], plain.output[i])
            << "k " << k << " layers " << layers << " token " << i;
    }
  }
  EXPECT_GE(compared, 10u);
}

// Drafts from scratch over the committed tokens x_0 .. x_L, by direct calls: the main model
// over x_0 .. x_{L-1}; pass p runs layer min(p, layers - 1): a layer's first pass over every
// teacher-forced row (h_s, x_{s+1}) for s < L and the chain rows (G_m, d_m) at L-1+m for
// m = 1 .. p, in one chunk from position 0; a layer used again, the one chain row (G_p, d_p).
struct Scratch {
  std::vector<int32_t> drafts;
  std::vector<float> logits;  // [k, vocab]
};
Scratch drafts_from_scratch(DeepseekV3Model& m, std::span<const int32_t> tokens, int64_t k,
                            int64_t layers) {
  const int64_t v = m.config().vocab_size, d = m.config().hidden_size;
  const int64_t L = static_cast<int64_t>(tokens.size()) - 1;
  KvCache cache = m.make_cache(L + k + 16).value();
  const int64_t seq = cache.add_sequence();
  StepOutput main_out, out;
  const TokenChunk tc = cache.chunk(seq, 0, tokens.first(static_cast<size_t>(L))).value();
  EXPECT_TRUE(m.forward({&tc, 1}, cache.storage(), main_out).ok());
  Scratch s;
  std::vector<float> g;  // [p, D] residual outputs of the draft rows
  for (int64_t p = 0; p < k; ++p) {
    const int64_t layer = std::min(p, layers - 1);
    std::vector<int32_t> next;
    std::vector<float> hidden;
    int64_t start = 0;
    if (p < layers) {
      next.assign(tokens.begin() + 1, tokens.end());
      hidden = main_out.hidden;
      next.insert(next.end(), s.drafts.begin(), s.drafts.end());
      hidden.insert(hidden.end(), g.begin(), g.end());
    } else {
      start = L - 1 + p;
      next.assign(1, s.drafts[p - 1]);
      hidden.assign(g.end() - d, g.end());
    }
    const MtpChunk mc = cache.mtp_chunk(seq, start, next, hidden.data()).value();
    EXPECT_TRUE(m.forward_mtp(layer, {&mc, 1}, cache.storage(), out).ok());
    const int64_t last = static_cast<int64_t>(next.size()) - 1;
    s.logits.insert(s.logits.end(), out.logits.begin() + last * v,
                    out.logits.begin() + (last + 1) * v);
    s.drafts.push_back(argmax(out.logits.data() + last * v, v));
    g.insert(g.end(), out.hidden.begin() + last * d, out.hidden.begin() + (last + 1) * d);
  }
  return s;
}

void expect_drafts_match_scratch(DeepseekV3Model& m, int64_t k, int64_t layers,
                                 std::span<const int32_t> prompt, int64_t steps) {
  const int64_t v = m.config().vocab_size;
  const MtpSpecDecodeOptions o = decode_options(m, k, layers, 200);
  KvCache cache = m.make_cache(static_cast<int64_t>(prompt.size()) + 256).value();
  MtpSpecDecoder dec(m, cache, cache.add_sequence(), o, scripted_accept(v, {1, 0, 2, k, 1, 3}));
  ASSERT_TRUE(dec.prefill(prompt).ok());
  int64_t compared_drafts = 0;
  for (int64_t step = 0; step <= steps; ++step) {
    if (step > 0) {
      ASSERT_TRUE(dec.step().ok());
    }
    ASSERT_FALSE(dec.finished());
    ASSERT_EQ(dec.state().drafts.size(), static_cast<size_t>(k));
    const Scratch s = drafts_from_scratch(m, dec.tokens(), k, layers);
    const std::span<const float> got = dec.draft_logits();
    ASSERT_EQ(got.size(), s.logits.size());
    for (int64_t p = 0; p < k; ++p) {
      const float* want = s.logits.data() + p * v;
      const double tol = kRowTol * max_abs(want, v);
      for (int64_t i = 0; i < v; ++i)
        ASSERT_NEAR(got[p * v + i], want[i], tol) << "step " << step << " draft " << p + 1;
      // A chained draft reads the earlier drafts: compare while they agree.
      if (relative_margin(want, v) <= kRowTol) break;
      ASSERT_EQ(dec.state().drafts[p], s.drafts[p]) << "step " << step << " draft " << p + 1;
      ++compared_drafts;
    }
  }
  EXPECT_GE(compared_drafts, (steps + 1) * k / 2);
}

TEST(SpeculativeDecode, DraftsAfterPartialAcceptanceEqualDraftsFromScratchShippedModel) {
  const auto m = load_deepseek(shipped_dir());
  ASSERT_NE(m, nullptr);
  expect_drafts_match_scratch(*m, 3, 1, kjv_prompt(1, 17), 8);
}

TEST(SpeculativeDecode, DraftsAfterPartialAcceptanceEqualDraftsFromScratchSeveralLayers) {
  const auto m = load_deepseek(tiny_dir("three_layers_drafts", 3, 7));
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = fixtures::random_ids(13, m->config().vocab_size, 5);
  expect_drafts_match_scratch(*m, 3, 3, prompt, 6);
  expect_drafts_match_scratch(*m, 4, 2, prompt, 6);
}

TEST(SpeculativeDecode, RollbackKeepsExactlyTheAcceptedPositions) {
  const auto m = load_deepseek(shipped_dir());
  ASSERT_NE(m, nullptr);
  const int64_t v = m->config().vocab_size, bs = 4, k = 3;
  const std::vector<int32_t> prompt = kjv_prompt(2, 13);
  KvCache cache = m->make_cache(256, bs).value();
  const int64_t seq = cache.add_sequence();
  // Accept 1 of 3 drafts, then 0: both leave rejected rows behind.
  MtpSpecDecoder dec(*m, cache, seq, decode_options(*m, k, 0, 100), scripted_accept(v, {1, 0}));
  ASSERT_TRUE(dec.prefill(prompt).ok());
  for (int step = 0; step < 6; ++step) {
    ASSERT_EQ(dec.state().drafts.size(), static_cast<size_t>(k));
    const int64_t before = dec.state().length;
    ASSERT_TRUE(dec.verify().ok());
    const int64_t length = dec.state().length;
    ASSERT_LT(length, before + k + 1) << "no draft was rejected";
    ASSERT_EQ(static_cast<int64_t>(dec.tokens().size()), length + 1);
    // Exactly the blocks of the accepted positions, in the table and in the allocator.
    const int64_t blocks = (length + bs - 1) / bs;
    EXPECT_EQ(static_cast<int64_t>(cache.blocks(seq).size()), blocks) << "step " << step;
    EXPECT_EQ(cache.allocator().used_count(), blocks) << "step " << step;
    cache.allocator().check_invariants();
    if (step % 2 == 1) {
      // The next token over the speculated cache equals a fresh computation over the
      // accepted tokens (the rejected rows past `length` are never read).
      const std::span<const int32_t> toks = dec.tokens();
      KvCache fresh = m->make_cache(length + 16).value();
      const int64_t fs = fresh.add_sequence();
      StepOutput a, b;
      const TokenChunk all = fresh.chunk(fs, 0, toks).value();
      ASSERT_TRUE(m->forward({&all, 1}, fresh.storage(), b).ok());
      KvCache& spec = cache;
      const TokenChunk next = spec.chunk(seq, length, toks.last(1)).value();
      ASSERT_TRUE(m->forward({&next, 1}, spec.storage(), a).ok());
      const double tol = kRowTol * max_abs(b.logits.data(), v);
      for (int64_t i = 0; i < v; ++i) ASSERT_NEAR(a.logits[i], b.logits[i], tol) << "vocab " << i;
      break;
    }
    ASSERT_TRUE(dec.propose().ok());
  }
}

TEST(SpeculativeDecode, StopAndMaxTokensCutInsideAnAcceptedRun) {
  const auto m = load_deepseek(shipped_dir());
  ASSERT_NE(m, nullptr);
  const int64_t v = m->config().vocab_size, k = 3;
  // The middle token of a run of three or more that does not occur before it, in the greedy
  // output of the first prompt (of real text) that has one.
  std::vector<int32_t> prompt;
  SpecRun full;
  size_t at = 0;
  for (int64_t row = 0; row < 3 && at == 0; ++row) {
    for (int64_t len : {9, 17, 33}) {
      prompt = kjv_prompt(row, len);
      full = spec_run(*m, prompt, decode_options(*m, k, 0, 60), greedy_accept(v));
      ASSERT_EQ(full.output.size(), 60u);
      size_t pos = full.step_sizes[0];
      for (size_t s = 1; s < full.step_sizes.size() && at == 0; ++s) {
        if (full.step_sizes[s] >= 3) {
          const auto begin = full.output.begin();
          if (std::find(begin, begin + pos + 1, full.output[pos + 1]) == begin + pos + 1) {
            at = pos + 1;
          }
        }
        pos += full.step_sizes[s];
      }
      if (at > 0) break;
    }
  }
  ASSERT_GT(at, 0u) << "no run of three tokens with a fresh middle one";
  const std::vector<int32_t> want(full.output.begin(), full.output.begin() + at + 1);
  // A stop id (as EOS is one) inside the run: the output ends with it.
  MtpSpecDecodeOptions o = decode_options(*m, k, 0, 60);
  o.stop_ids = {full.output[at]};
  const SpecRun stopped = spec_run(*m, prompt, o, greedy_accept(v));
  EXPECT_EQ(stopped.output, want);
  // max_tokens ending inside the run: the decoder verifies no draft it could not emit, and
  // the output is the same prefix. (The cut of a longer run: mtp_spec_cut's unit test.)
  o.stop_ids.clear();
  o.max_tokens = static_cast<int64_t>(at) + 1;
  const SpecRun cut = spec_run(*m, prompt, o, greedy_accept(v));
  EXPECT_EQ(cut.output, want);
  // Scripted acceptance of two drafts a step, cut by a stop id inside a run: the tokens up
  // to the stop id, whatever the verify rows say after it.
  const SpecRun runs = spec_run(*m, prompt, decode_options(*m, k, 0, 30), scripted_accept(v, {2}));
  ASSERT_EQ(runs.output.size(), 30u);
  const size_t mid = runs.step_sizes[0] + 3 + 1;  // the middle of the second step's run
  ASSERT_EQ(runs.step_sizes[1], 3u);
  ASSERT_EQ(runs.step_sizes[2], 3u);
  const auto first = std::find(runs.output.begin(), runs.output.end(), runs.output[mid]);
  o = decode_options(*m, k, 0, 30);
  o.stop_ids = {runs.output[mid]};
  const SpecRun scripted_stop = spec_run(*m, prompt, o, scripted_accept(v, {2}));
  EXPECT_EQ(scripted_stop.output, std::vector<int32_t>(runs.output.begin(), first + 1));
}

TEST(MtpSpecCut, StopIdsAndRemaining) {
  const std::vector<int32_t> run = {4, 7, 1, 9};
  const std::vector<int32_t> eos = {1};
  MtpSpecCut c = mtp_spec_cut(run, eos, 10);  // EOS third: emitted, then nothing
  EXPECT_EQ(c.count, 3);
  EXPECT_TRUE(c.stopped);
  EXPECT_FALSE(c.length);
  c = mtp_spec_cut(run, eos, 2);  // max_tokens first
  EXPECT_EQ(c.count, 2);
  EXPECT_FALSE(c.stopped);
  EXPECT_TRUE(c.length);
  c = mtp_spec_cut(run, eos, 3);  // both at the third: the stop id is the reason
  EXPECT_EQ(c.count, 3);
  EXPECT_TRUE(c.stopped);
  c = mtp_spec_cut(run, {}, 4);  // exactly the remaining tokens
  EXPECT_EQ(c.count, 4);
  EXPECT_TRUE(c.length);
  c = mtp_spec_cut(run, {}, 9);
  EXPECT_EQ(c.count, 4);
  EXPECT_FALSE(c.length || c.stopped);
  const std::vector<int32_t> stops = {9, 4};
  c = mtp_spec_cut(run, stops, 9);  // the first token already stops
  EXPECT_EQ(c.count, 1);
  EXPECT_TRUE(c.stopped);
}

}  // namespace
}  // namespace xds

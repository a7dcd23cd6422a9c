// EngineCore in one process, no sockets and no fabric: requests stepped to the end give each
// request the greedy tokens of a plain reference loop over the same checkpoint (one sequence,
// the prompt as one chunk, then one token per forward, argmax over the logits row), alone and
// batched with others; a cancel ends a request with "abort"; a request of n = 2 greedy
// choices gives the same tokens twice; a request resumed from the first k tokens of a run
// (token recomputation after a fault) gives exactly the rest of that run, sampled with a seed
// and with penalties as well as greedy, n = 2 included.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "model/kv_cache.h"
#include "model/registry.h"
#include "test_models.h"

namespace xds::engine {
namespace {

const std::string& checkpoint() {
  static const std::string dir = fixtures::random_checkpoint("engine_core", 91, /*mtp=*/1);
  return dir;
}

EngineCoreOptions core_options() {
  EngineCoreOptions o;
  o.model_dir = checkpoint();
  o.model.threads = 2;
  o.kv_memory_bytes = int64_t{64} << 20;
  o.max_num_batched_tokens = 256;
  return o;
}

// Greedy tokens of `prompt` by the reference loop.
std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int32_t max_tokens) {
  ModelOptions mo;
  mo.threads = 2;
  auto model = load_causal_lm(checkpoint(), mo);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  KvStorageShape shape;
  shape.layout = (*model)->kv_layout();
  shape.block_size = 16;
  shape.num_blocks = 64;
  auto cache = KvCache::create(shape, KvStorage::bytes_for(shape));
  EXPECT_TRUE(cache.ok()) << cache.status().to_string();
  const int64_t seq = cache->add_sequence();
  const int64_t vocab = (*model)->info().vocab_size;
  std::vector<int32_t> tokens = prompt, out;
  int64_t pos = 0;
  while (static_cast<int32_t>(out.size()) < max_tokens) {
    const auto in = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(pos));
    auto c = cache->chunk(seq, pos, in);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    StepOutput so;
    EXPECT_TRUE((*model)->forward({&*c, 1}, cache->storage(), so).ok());
    pos = static_cast<int64_t>(tokens.size());
    const float* row = so.logits.data();
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

EngineRequest greedy(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens,
                     int32_t n = 1) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.n = n;
  return r;
}

// Steps until no work; the tokens and final reasons per (id, index).
struct Outputs {
  std::map<std::pair<std::string, int32_t>, std::vector<int32_t>> tokens;
  std::map<std::pair<std::string, int32_t>, std::string> reason;
};
Outputs run(EngineCore& core) {
  Outputs o;
  std::vector<TokenDelta> d;
  for (int i = 0; i < 1000 && core.has_work(); ++i) {
    d.clear();
    const Status st = core.step(&d);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
    for (const TokenDelta& x : d) {
      auto& t = o.tokens[{x.request_id, x.index}];
      t.insert(t.end(), x.tokens.begin(), x.tokens.end());
      if (!x.finish_reason.empty()) o.reason[{x.request_id, x.index}] = x.finish_reason;
    }
  }
  EXPECT_FALSE(core.has_work());
  return o;
}

TEST(EngineCore, GreedyTokensEqualThePlainLoopAloneAndBatched) {
  auto core = EngineCore::create(core_options());
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const int64_t vocab = (*core)->info().vocab_size;
  const std::vector<int32_t> p0 = fixtures::random_ids(21, vocab, 5);
  const std::vector<int32_t> p1 = fixtures::random_ids(7, vocab, 6);
  const std::vector<int32_t> p2 = fixtures::random_ids(40, vocab, 7);
  const std::vector<int32_t> r0 = reference(p0, 6), r1 = reference(p1, 4), r2 = reference(p2, 5);

  ASSERT_TRUE((*core)->add_request(greedy("alone", p0, 6)).ok());
  Outputs o = run(**core);
  EXPECT_EQ((o.tokens[{"alone", 0}]), r0);
  EXPECT_EQ((o.reason[{"alone", 0}]), "length");

  ASSERT_TRUE((*core)->add_request(greedy("a", p0, 6)).ok());
  ASSERT_TRUE((*core)->add_request(greedy("b", p1, 4)).ok());
  ASSERT_TRUE((*core)->add_request(greedy("c", p2, 5)).ok());
  EXPECT_FALSE((*core)->add_request(greedy("c", p2, 5)).ok());  // an id already held
  o = run(**core);
  EXPECT_EQ((o.tokens[{"a", 0}]), r0);
  EXPECT_EQ((o.tokens[{"b", 0}]), r1);
  EXPECT_EQ((o.tokens[{"c", 0}]), r2);
}

TEST(EngineCore, CancelAbortsAndForkedGreedyChoicesAgree) {
  auto core = EngineCore::create(core_options());
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const int64_t vocab = (*core)->info().vocab_size;
  const std::vector<int32_t> p = fixtures::random_ids(19, vocab, 8);
  ASSERT_TRUE((*core)->add_request(greedy("x", p, 50)).ok());
  ASSERT_TRUE((*core)->add_request(greedy("two", p, 5, /*n=*/2)).ok());
  std::vector<TokenDelta> d;
  ASSERT_TRUE((*core)->step(&d).ok());
  (*core)->cancel("x", -1);
  Outputs o = run(**core);
  EXPECT_EQ((o.reason[{"x", 0}]), "abort");
  const std::vector<int32_t> r = reference(p, 5);
  // The first step's deltas carried the first tokens.
  for (const TokenDelta& x : d) {
    if (x.request_id != "two") continue;
    auto& t = o.tokens[{x.request_id, x.index}];
    t.insert(t.begin(), x.tokens.begin(), x.tokens.end());
  }
  EXPECT_EQ((o.tokens[{"two", 0}]), r);
  EXPECT_EQ((o.tokens[{"two", 1}]), r);
}

// The request of a fault-free run, cut after `k` tokens per choice and sent again with them
// (as "<id>-<k>").
EngineRequest resumed(EngineRequest r, const Outputs& whole, size_t k) {
  const std::string id = r.id;
  r.id += "-" + std::to_string(k);
  for (int32_t i = 0; i < r.sampling.n; ++i) {
    const std::vector<int32_t>& t = whole.tokens.at({id, i});
    r.resume.emplace_back(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(std::min(k, t.size())));
    r.resume_finished.push_back(k >= t.size() ? 1 : 0);
  }
  return r;
}

TEST(EngineCore, AResumedRequestContinuesExactlyWhereTheRunWas) {
  auto core = EngineCore::create(core_options());
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  const int64_t vocab = (*core)->info().vocab_size;
  const std::vector<int32_t> p = fixtures::random_ids(23, vocab, 9);
  EngineRequest g = greedy("g", p, 9);
  EngineRequest s = greedy("s", p, 12, /*n=*/2);
  s.sampling.temperature = 0.9f;
  s.sampling.top_p = 0.95f;
  s.sampling.seed = 1234;
  s.sampling.frequency_penalty = 0.7f;  // the counts must include the resumed tokens
  s.sampling.presence_penalty = 0.3f;
  ASSERT_TRUE((*core)->add_request(g).ok());
  ASSERT_TRUE((*core)->add_request(s).ok());
  const Outputs whole = run(**core);
  ASSERT_EQ((whole.tokens.at({"g", 0})), reference(p, 9));

  for (size_t k : {size_t{1}, size_t{4}, size_t{8}}) {
    SCOPED_TRACE(k);
    ASSERT_TRUE((*core)->add_request(resumed(g, whole, k)).ok());
    ASSERT_TRUE((*core)->add_request(resumed(s, whole, k)).ok());
    Outputs rest = run(**core);
    for (const auto& [id, n] : {std::pair<std::string, int32_t>{"g", 1}, {"s", 2}}) {
      for (int32_t i = 0; i < n; ++i) {
        const std::vector<int32_t>& t = whole.tokens.at({id, i});
        const std::vector<int32_t> tail(t.begin() + static_cast<std::ptrdiff_t>(k), t.end());
        const std::string resumed_id = id + "-" + std::to_string(k);
        EXPECT_EQ((rest.tokens[{resumed_id, i}]), tail) << id << " choice " << i;
        EXPECT_EQ((rest.reason[{resumed_id, i}]), whole.reason.at({id, i}));
      }
    }
  }
}

}  // namespace
}  // namespace xds::engine

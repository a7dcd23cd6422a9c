// ScriptedLm (the test model whose greedy output is a script): its config, its rule against a
// brute-force reference, and its greedy continuation through block tables as the engine
// drives them (chunked prefill, batches, forks with copy on write, prefix-cache hits), which
// must be the script written here; bad block tables are errors that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "model/block_allocator.h"
#include "model/kv_storage.h"
#include "model/registry.h"
#include "model/scripted_lm.h"
#include "test_files.h"

namespace xds {
namespace {

using testing::TempDirTest;

constexpr int64_t kVocab = 64;
constexpr int32_t kEos = 1;
// Self-overlapping on purpose: "7 8 7 8 9" and "7 8 7" make a naive "count the matched ids"
// go wrong.
const std::vector<int32_t> kScript = {7, 8, 7, 8, 9, 7, 8, 7, 10, 11};

ScriptedLmConfig script_config() {
  ScriptedLmConfig c;
  c.vocab_size = kVocab;
  c.max_position_embeddings = 256;
  c.script = kScript;
  c.eos_token_ids = {kEos};
  return c;
}

std::unique_ptr<ScriptedLm> make_model() {
  auto m = ScriptedLm::create(script_config(), "scripted");
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

// The rule written out directly: the longest suffix of the context that equals a prefix of
// the script, tried from the longest length down.
int32_t reference_next(const std::vector<int32_t>& context) {
  const size_t n = kScript.size();
  for (size_t len = std::min(n, context.size()); len > 0; --len) {
    if (std::equal(kScript.begin(), kScript.begin() + static_cast<ptrdiff_t>(len),
                   context.end() - static_cast<ptrdiff_t>(len))) {
      return len == n ? kEos : kScript[len];
    }
  }
  return kScript[0];
}

// The id with the largest logit of row r; checks the row is kScriptedLogit there, 0 elsewhere.
int32_t argmax_row(const StepOutput& out, size_t r) {
  const float* row = out.logits.data() + r * static_cast<size_t>(kVocab);
  const int32_t best = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
  for (int64_t v = 0; v < kVocab; ++v) {
    EXPECT_EQ(row[v], v == best ? kScriptedLogit : 0.0f) << "row " << r << " id " << v;
  }
  return best;
}

KvStorage storage(const CausalLm& m, int64_t blocks, int64_t block_size) {
  return KvStorage::create({m.kv_layout(), blocks, block_size}, -1).value();
}

std::vector<int32_t> script_then_eos() {
  std::vector<int32_t> want = kScript;
  want.push_back(kEos);
  return want;
}

// One sequence as the engine runs it: a block table that grows, chunks at its length.
struct Seq {
  std::vector<int32_t> tokens;  // the whole context so far
  std::vector<int32_t> table;
  int64_t cached = 0;  // positions already in the cache
};

// Reserves blocks so the table covers `length` positions.
void reserve(BlockAllocator& blocks, Seq& s, int64_t length, int64_t block_size) {
  const int64_t need = (length + block_size - 1) / block_size;
  const int64_t have = static_cast<int64_t>(s.table.size());
  if (need > have) {
    ASSERT_TRUE(blocks.allocate(need - have, s.table).ok());
  }
}

// Runs the uncached positions of `s` in chunks of at most `chunk` tokens, then decodes greedily
// until eos or `limit` new tokens; returns the new tokens.
std::vector<int32_t> run(ScriptedLm& m, KvStorage& kv, BlockAllocator& blocks, Seq& s,
                         int64_t chunk, int limit) {
  StepOutput out;
  std::vector<int32_t> produced;
  while (static_cast<int>(produced.size()) < limit) {
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    int32_t next = -1;
    while (s.cached < len) {
      const int64_t n = std::min(chunk, len - s.cached);
      reserve(blocks, s, s.cached + n, kv.block_size());
      const TokenChunk c{
          s.cached,
          std::span(s.tokens).subspan(static_cast<size_t>(s.cached), static_cast<size_t>(n)),
          s.table, false};
      const Status st = m.forward({&c, 1}, kv, out);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok()) return produced;
      EXPECT_EQ(out.logit_tokens, (std::vector<int64_t>{n - 1}));
      s.cached += n;
      next = argmax_row(out, 0);
    }
    produced.push_back(next);
    s.tokens.push_back(next);
    if (next == kEos) break;
  }
  return produced;
}

TEST(ScriptedLmRule, MatchesTheBruteForceLongestSuffixPrefix) {
  const auto m = make_model();
  ASSERT_NE(m, nullptr);
  std::mt19937 rng(5);
  // Contexts over the script's own ids and two others, so that partial matches are common.
  const std::vector<int32_t> alphabet = {7, 8, 9, 10, 11, 3, kEos};
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<size_t> length(1, 30);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> ctx(length(rng));
    for (auto& x : ctx) x = alphabet[pick(rng)];
    if (trial % 3 == 0) {  // end inside the script
      const size_t k = trial % kScript.size();
      ctx.insert(ctx.end(), kScript.begin(), kScript.begin() + static_cast<ptrdiff_t>(k));
    }
    ASSERT_EQ(m->next_token(ctx), reference_next(ctx)) << "trial " << trial;
  }
  // The whole script gives eos; without an eos id the script starts again.
  EXPECT_EQ(m->next_token(kScript), kEos);
  ScriptedLmConfig no_eos = script_config();
  no_eos.eos_token_ids.clear();
  EXPECT_EQ(ScriptedLm::create(no_eos, "x").value()->next_token(kScript), kScript[0]);
  EXPECT_EQ(m->next_token(std::vector<int32_t>{3}), kScript[0]);
}

TEST(ScriptedLm, InfoAndLayoutHaveNoExpertsAndOneTokenPlane) {
  const auto m = make_model();
  ASSERT_NE(m, nullptr);
  const ModelInfo& info = m->info();
  EXPECT_EQ(info.model_type, "xds_scripted");
  EXPECT_EQ(info.name, "scripted");
  EXPECT_EQ(info.vocab_size, kVocab);
  EXPECT_EQ(info.max_position_embeddings, 256);
  EXPECT_EQ(info.n_routed_experts, 0);
  EXPECT_EQ(info.n_mtp_layers, 0);
  EXPECT_TRUE(info.moe_layers.empty());
  EXPECT_EQ(info.eos_token_ids, (std::vector<int64_t>{kEos}));
  EXPECT_TRUE(m->routed_token_counts().empty());
  EXPECT_EQ(m->moe_weights(0), nullptr);
  const KvLayout kv = m->kv_layout();
  EXPECT_EQ(kv.layers, 1);
  ASSERT_EQ(kv.planes.size(), 1u);
  EXPECT_EQ(kv.planes[0].dtype, DType::kI32);
  EXPECT_EQ(kv.planes[0].elements, 1);
  EXPECT_EQ(kv.planes[0].row_bytes, 4);
  KvStorage storage_ = storage(*m, 2, 4);
  StepOutput out;
  const Status mtp = m->forward_mtp(0, {}, storage_, out);
  EXPECT_EQ(mtp.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mtp.message().find("MTP layer 0"), std::string::npos) << mtp.message();
  // No chunks: a valid step with empty outputs.
  out.logits.assign(3, 1.0f);
  out.logit_tokens.assign(2, 0);
  ASSERT_TRUE(m->forward({}, storage_, out).ok());
  EXPECT_TRUE(out.logits.empty() && out.logit_tokens.empty() && out.hidden.empty());
}

// The greedy continuation is the script then eos, whatever the prefill chunks and block size.
TEST(ScriptedLm, GreedyContinuationIsTheScriptUnderChunkedPrefill) {
  const auto m = make_model();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = {3, 12, 13, 7, 8, 14, 15, 16, 17, 18, 19, 20, 21, 22, 2};
  for (const int64_t block_size : {1, 4, 16}) {
    for (const int64_t chunk : {1, 3, 7, 64}) {
      KvStorage kv = storage(*m, 64, block_size);
      BlockAllocator blocks(64);
      Seq s;
      s.tokens = prompt;
      EXPECT_EQ(run(*m, kv, blocks, s, chunk, 40), script_then_eos())
          << "block size " << block_size << ", chunks of " << chunk;
    }
  }
}

// Logits for every token (all_logits) and two sequences in one step: each row follows the
// rule on its own sequence's context.
TEST(ScriptedLm, EveryRowOfABatchFollowsTheRuleOnItsOwnContext) {
  const auto m = make_model();
  ASSERT_NE(m, nullptr);
  KvStorage kv = storage(*m, 16, 4);
  const std::vector<int32_t> a = {3, 7, 8, 7, 8, 9, 7, 8, 7, 10, 11, 5};
  const std::vector<int32_t> b = {2, 7, 8, 7};
  const std::vector<int32_t> table_a = {5, 2, 9}, table_b = {0, 1};
  const TokenChunk chunks[] = {{0, a, table_a, true}, {0, b, table_b, false}};
  StepOutput out;
  ASSERT_TRUE(m->forward(chunks, kv, out).ok());
  ASSERT_EQ(out.logit_tokens.size(), a.size() + 1);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(out.logit_tokens[i], static_cast<int64_t>(i));
    const std::vector<int32_t> ctx(a.begin(), a.begin() + static_cast<ptrdiff_t>(i + 1));
    EXPECT_EQ(argmax_row(out, i), reference_next(ctx)) << "row " << i;
  }
  EXPECT_EQ(out.logit_tokens.back(), static_cast<int64_t>(a.size() + b.size() - 1));
  EXPECT_EQ(argmax_row(out, a.size()), 8);  // "7 8 7" -> the script's 4th id
  EXPECT_TRUE(out.hidden.empty());
}

// A fork as the engine makes one (blocks shared, the partial block copied on write) and a
// prefix-cache hit (a new sequence whose table starts with another's full blocks): each
// continues from its own context, and the shared blocks are never written.
TEST(ScriptedLm, ForkedAndPrefixSharedBlocksGiveTheColdRunsContinuation) {
  const auto m = make_model();
  ASSERT_NE(m, nullptr);
  constexpr int64_t kBlock = 4;
  KvStorage kv = storage(*m, 32, kBlock);
  BlockAllocator blocks(32);
  // A: a prompt and the script's first 3 ids (10 positions: blocks 0, 1 full, 2 partial).
  Seq a;
  a.tokens = {3, 12, 13, 14, 15, 16, 17};
  a.tokens.insert(a.tokens.end(), kScript.begin(), kScript.begin() + 3);
  StepOutput out;
  reserve(blocks, a, 10, kBlock);
  const TokenChunk prefill{0, a.tokens, a.table, false};
  ASSERT_TRUE(m->forward({&prefill, 1}, kv, out).ok());
  a.cached = 10;
  EXPECT_EQ(argmax_row(out, 0), kScript[3]);

  // B forks A: every block shared; B's first write (position 10) lands in the partial block.
  Seq b = a;
  blocks.ref(b.table);
  const BlockAllocator::Writable w = blocks.ensure_writable(b.table[2]).value();
  ASSERT_GE(w.copy_from, 0);
  kv.copy_block(w.copy_from, w.block);
  b.table[2] = w.block;
  std::vector<std::byte> shared_before(static_cast<size_t>(2 * kv.block_bytes()));
  std::memcpy(shared_before.data(), kv.block_ptr(a.table[0]),
              static_cast<size_t>(kv.block_bytes()));
  std::memcpy(shared_before.data() + kv.block_bytes(), kv.block_ptr(a.table[1]),
              static_cast<size_t>(kv.block_bytes()));

  // B leaves the script (id 5), A follows it: A finishes the script, B starts it over.
  b.tokens.push_back(5);
  const std::vector<int32_t> from_b = run(*m, kv, blocks, b, 1, 40);
  a.tokens.push_back(kScript[3]);
  const std::vector<int32_t> from_a = run(*m, kv, blocks, a, 1, 40);
  std::vector<int32_t> want_a(kScript.begin() + 4, kScript.end());
  want_a.push_back(kEos);
  EXPECT_EQ(from_a, want_a);
  EXPECT_EQ(from_b, script_then_eos());
  EXPECT_EQ(std::memcmp(shared_before.data(), kv.block_ptr(a.table[0]),
                        static_cast<size_t>(kv.block_bytes())),
            0);
  EXPECT_EQ(std::memcmp(shared_before.data() + kv.block_bytes(), kv.block_ptr(a.table[1]),
                        static_cast<size_t>(kv.block_bytes())),
            0);

  // C hits A's first two full blocks in the prefix cache (8 cached positions: the prompt and
  // the script's first id) and prefills the rest in one chunk.
  Seq c;
  c.tokens.assign(a.tokens.begin(), a.tokens.begin() + 8);
  c.tokens.push_back(kScript[1]);
  c.table = {a.table[0], a.table[1]};
  blocks.ref(c.table);
  c.cached = 8;
  std::vector<int32_t> want_c(kScript.begin() + 2, kScript.end());
  want_c.push_back(kEos);
  EXPECT_EQ(run(*m, kv, blocks, c, 16, 40), want_c);
}

// A table that does not cover a chunk, names a block outside the storage, or a token outside
// the vocabulary: InvalidArgument naming the chunk, and nothing is written.
TEST(ScriptedLm, BadBlockTablesAreErrorsThatWriteNothing) {
  const auto m = make_model();
  ASSERT_NE(m, nullptr);
  KvStorage kv = storage(*m, 4, 4);
  const std::vector<int32_t> ids = {3, 7, 8, 7, 8, 9};
  const std::vector<int32_t> two = {0, 1}, one = {2}, bad = {3, 9};
  StepOutput out;
  const TokenChunk short_table[] = {{0, std::span(ids).first(2), two, false}, {0, ids, one, false}};
  const Status s = m->forward(short_table, kv, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk 1: positions [0, 6) need 2 blocks of 4 rows, its block "
                             "table has 1"),
            std::string::npos)
      << s.message();
  const TokenChunk out_of_range[] = {{0, ids, two, false}, {0, ids, bad, false}};
  const Status r = m->forward(out_of_range, kv, out);
  EXPECT_NE(r.message().find("chunk 1: block table entry 1 is block 9, outside [0, 4)"),
            std::string::npos)
      << r.message();
  const std::vector<int32_t> big = {3, static_cast<int32_t>(kVocab)};
  const TokenChunk bad_token{0, big, two, false};
  const Status t = m->forward({&bad_token, 1}, kv, out);
  EXPECT_NE(t.message().find("chunk 0: token 1 is id 64, out of range [0, 64)"), std::string::npos)
      << t.message();
  const TokenChunk negative{-1, ids, two, false};
  EXPECT_EQ(m->forward({&negative, 1}, kv, out).code(), StatusCode::kInvalidArgument);
  for (int64_t i = 0; i < kv.bytes(); ++i) ASSERT_EQ(kv.data()[i], std::byte{0}) << i;
  // Another model's storage is refused.
  KvStorage wrong = KvStorage::create({mla_kv_layout(1, 8, 4, DType::kF32), 4, 4}, -1).value();
  const TokenChunk fine{0, ids, two, false};
  EXPECT_EQ(m->forward({&fine, 1}, wrong, out).code(), StatusCode::kInvalidArgument);
}

class ScriptedLmConfigTest : public TempDirTest {};

TEST_F(ScriptedLmConfigTest, LoadsThroughTheRegistryWithGenerationConfigEos) {
  write("config.json", R"({"model_type": "xds_scripted", "vocab_size": 64,
    "max_position_embeddings": 128, "script_token_ids": [7, 8, 9], "eos_token_id": 2,
    "architectures": ["XdsScriptedForCausalLM"]})");
  write("generation_config.json", R"({"eos_token_id": [1, 2], "bos_token_id": 0})");
  EXPECT_EQ(causal_lm_type(dir()).value(), "xds_scripted");
  const auto info = load_model_info(dir());
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->model_type, "xds_scripted");
  EXPECT_EQ(info->vocab_size, 64);
  EXPECT_EQ(info->max_position_embeddings, 128);
  EXPECT_EQ(info->eos_token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(info->bos_token_id, 0);
  EXPECT_TRUE(info->moe_layers.empty());
  const auto m = load_causal_lm(dir(), {});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->info().eos_token_ids, info->eos_token_ids);
  EXPECT_EQ((*m)->info().name, info->name);
  const std::vector<std::string> types = supported_model_types();
  EXPECT_NE(std::find(types.begin(), types.end(), "xds_scripted"), types.end());
  auto& scripted = dynamic_cast<ScriptedLm&>(**m);
  EXPECT_EQ(scripted.next_token(std::vector<int32_t>{7, 8, 9}), 1);  // the first eos id
}

TEST_F(ScriptedLmConfigTest, BadConfigsAreErrorsNamingTheField) {
  struct Case {
    const char* json;
    const char* want;
  };
  const Case cases[] = {
      {R"({"vocab_size": 8, "max_position_embeddings": 8, "script_token_ids": [1]})",
       "field 'model_type': required but missing"},
      {R"({"model_type": "xds_scripted", "vocab_size": 8, "max_position_embeddings": 8})",
       "field 'script_token_ids': required but missing"},
      {R"({"model_type": "xds_scripted", "vocab_size": 8, "max_position_embeddings": 8,
          "script_token_ids": []})",
       "field 'script_token_ids': expected a non-empty list"},
      {R"({"model_type": "xds_scripted", "vocab_size": 8, "max_position_embeddings": 8,
          "script_token_ids": [1, "x"]})",
       "field 'script_token_ids': expected a non-empty list"},
      {R"({"model_type": "xds_scripted", "vocab_size": 8, "max_position_embeddings": 8,
          "script_token_ids": [1, 8]})",
       "field 'script_token_ids': entry 1 is id 8, not below vocab_size (8)"},
      {R"({"model_type": "xds_scripted", "vocab_size": 0, "max_position_embeddings": 8,
          "script_token_ids": [1]})",
       "field 'vocab_size': expected an integer in [1, 1048576], found 0"},
      {R"({"model_type": "xds_scripted", "vocab_size": 8, "max_position_embeddings": -2,
          "script_token_ids": [1]})",
       "field 'max_position_embeddings': expected an integer in [1, 2147483647], found -2"},
      {R"({"model_type": "xds_scripted", "vocab_size": 8, "max_position_embeddings": 8,
          "script_token_ids": [1], "eos_token_id": 9})",
       "field 'eos_token_id': id 9 is not below vocab_size (8)"},
  };
  for (const Case& c : cases) {
    const auto r = parse_scripted_lm_config(c.json, "cfg.json");
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("cfg.json: ") + c.want), std::string::npos)
        << r.status().message();
  }
  write("config.json", R"({"model_type": "xds_scripted", "vocab_size": 8,
    "max_position_embeddings": 8, "script_token_ids": [1]})");
  write("generation_config.json", R"({"eos_token_id": 8})");
  const auto gen = load_model_info(dir());
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.status().message().find("generation_config.json: field 'eos_token_id': id 8"),
            std::string::npos)
      << gen.status().message();
}

}  // namespace
}  // namespace xds

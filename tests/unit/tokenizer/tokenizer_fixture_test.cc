// Encode / decode / streaming of the published Qwen3 and DeepSeek-V3 tokenizers against ids
// produced by @huggingface/tokenizers (tests/fixtures/tokenizer/gen/gen_fixtures.mjs).
#include <thread>

#include "fixtures.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace xds {
namespace {

class FamilyTest : public ::testing::TestWithParam<std::string> {};

std::string stream_decode(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer d(t, skip);
  std::string out;
  for (const int32_t id : ids) {
    std::string piece = d.push(id);
    EXPECT_EQ(utf8::find_invalid(piece), std::string::npos) << "half a character emitted";
    out += piece;
  }
  return out + d.flush();
}

// One test per family (one tokenizer load per process): encode with and without special
// tokens, decode with and without skipping them, streaming decode, and concurrent encodes.
TEST_P(FamilyTest, MatchesHuggingFace) {
  const Tokenizer& t = test::fixture_tokenizer(GetParam());
  const auto cases = test::read_json(test::fixture_dir() + "/expected/encode_" + GetParam() + ".json");
  ASSERT_GT(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    std::string text = test::from_hex(c["text_hex"]);
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    if (name.starts_with("invalid_utf8")) {
      auto bad = t.encode(text, false);
      ASSERT_FALSE(bad.ok());
      EXPECT_NE(bad.status().message().find("not valid UTF-8"), std::string::npos);
      text = utf8::replace_invalid(text);  // what Python / JS would have received
    }
    auto got = t.encode(text, false);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, ids);
    auto got_sp = t.encode(text, true);
    ASSERT_TRUE(got_sp.ok());
    EXPECT_EQ(*got_sp, c["ids_special"].get<std::vector<int32_t>>());
    EXPECT_EQ(t.decode(ids, false), c["decoded"].get<std::string>());
    EXPECT_EQ(t.decode(ids, true), c["decoded_skip_special"].get<std::string>());
    for (const bool skip : {false, true}) {
      EXPECT_EQ(stream_decode(t, ids, skip), t.decode(ids, skip)) << "skip=" << skip;
    }
  }
  // Concurrent encodes share the tokenizer and give the same ids.
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (const auto& c : cases) {
        const std::string text = utf8::replace_invalid(test::from_hex(c["text_hex"]));
        auto got = t.encode(text, false);
        if (!got.ok() || *got != c["ids"].get<std::vector<int32_t>>()) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);

  if (GetParam() == "qwen3") {
    EXPECT_EQ(t.vocab_size(), 151669);  // 151643 vocab + 26 added tokens (ids up to 151668)
    EXPECT_FALSE(t.bos_id().has_value());
    EXPECT_FALSE(t.adds_bos());
    EXPECT_EQ(t.eos_id(), 151645);       // <|im_end|>
    EXPECT_TRUE(t.is_special(151644));   // <|im_start|>
    EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  } else {
    EXPECT_EQ(t.vocab_size(), 128815);
    EXPECT_EQ(t.bos_id(), 0);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_TRUE(t.adds_bos());
    EXPECT_TRUE(t.is_special(0));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest, ::testing::Values("qwen3", "deepseek_v3"));

// Long runs of one character: 64 KiB of spaces, letters, newlines through DeepSeek-V3's three
// Split regexes and BPE. The regex scan is linear in the run and BPE merging is O(n log n)
// (min-heap over a linked list), so this stays fast; the result must still round-trip.
// bench/tokenizer measures the scaling (docs/benchmarks.md).
TEST(TokenizerLongRuns, RoundTrip) {
  const Tokenizer* t = &test::fixture_tokenizer("deepseek_v3");
  for (const char ch : {' ', 'a', '\n'}) {
    const std::string text(64 * 1024, ch);
    auto ids = t->encode(text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(t->decode(*ids, false), text);
    EXPECT_LT(ids->size(), text.size());
  }
}

}  // namespace
}  // namespace xds

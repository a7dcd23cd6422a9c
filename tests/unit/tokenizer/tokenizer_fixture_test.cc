// Encode / decode / streaming of the published Qwen3 and DeepSeek-V3 tokenizers against ids
// produced by @huggingface/tokenizers (tests/fixtures/tokenizer/gen/gen_fixtures.mjs).
#include <thread>

#include "fixtures.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace xds {
namespace {

class FamilyTest : public ::testing::TestWithParam<std::string> {
 protected:
  static const Tokenizer& tok(const std::string& fam) {
    static std::map<std::string, Tokenizer> cache;
    auto it = cache.find(fam);
    if (it == cache.end()) {
      auto r = Tokenizer::load(test::fixture_dir() + "/" + fam);
      XDS_CHECK(r.ok(), "{}", r.status().to_string());
      it = cache.emplace(fam, std::move(r).value()).first;
    }
    return it->second;
  }
  static nlohmann::ordered_json cases(const std::string& fam) {
    return test::read_json(test::fixture_dir() + "/expected/encode_" + fam + ".json");
  }
};

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

TEST_P(FamilyTest, EncodeMatchesHuggingFace) {
  const Tokenizer& t = tok(GetParam());
  for (const auto& c : cases(GetParam())) {
    const std::string name = c["name"];
    std::string text = test::from_hex(c["text_hex"]);
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    if (name.starts_with("invalid_utf8")) {
      auto bad = t.encode(text, false);
      ASSERT_FALSE(bad.ok()) << name;
      EXPECT_NE(bad.status().message().find("not valid UTF-8"), std::string::npos);
      text = utf8::replace_invalid(text);
    }
    auto got = t.encode(text, false);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().to_string();
    EXPECT_EQ(*got, ids) << name;
    auto got_sp = t.encode(text, true);
    ASSERT_TRUE(got_sp.ok());
    EXPECT_EQ(*got_sp, c["ids_special"].get<std::vector<int32_t>>()) << name;
  }
}

TEST_P(FamilyTest, DecodeMatchesHuggingFace) {
  const Tokenizer& t = tok(GetParam());
  for (const auto& c : cases(GetParam())) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(t.decode(ids, false), c["decoded"].get<std::string>()) << c["name"];
    EXPECT_EQ(t.decode(ids, true), c["decoded_skip_special"].get<std::string>()) << c["name"];
  }
}

TEST_P(FamilyTest, StreamingEqualsFullDecode) {
  const Tokenizer& t = tok(GetParam());
  for (const auto& c : cases(GetParam())) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    for (const bool skip : {false, true}) {
      EXPECT_EQ(stream_decode(t, ids, skip), t.decode(ids, skip)) << c["name"] << " skip=" << skip;
    }
  }
}

TEST_P(FamilyTest, ConcurrentEncodeIsDeterministic) {
  const Tokenizer& t = tok(GetParam());
  const auto cs = cases(GetParam());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (const auto& c : cs) {
        const std::string text = utf8::replace_invalid(test::from_hex(c["text_hex"]));
        auto got = t.encode(text, false);
        if (!got.ok() || *got != c["ids"].get<std::vector<int32_t>>()) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(FamilyTest, SpecialIdsAndSizes) {
  const Tokenizer& t = tok(GetParam());
  if (GetParam() == "qwen3") {
    EXPECT_EQ(t.vocab_size(), 151669);  // 151643 vocab + 26 added tokens (ids up to 151668)
    EXPECT_FALSE(t.bos_id().has_value());
    EXPECT_EQ(t.eos_id(), 151645);      // <|im_end|>
    EXPECT_TRUE(t.is_special(151644));  // <|im_start|>
    EXPECT_FALSE(t.is_special(151667)); // <think> is added but not special
  } else {
    EXPECT_EQ(t.vocab_size(), 128815);
    EXPECT_EQ(t.bos_id(), 0);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_TRUE(t.adds_bos());
    EXPECT_TRUE(t.is_special(0));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest, ::testing::Values("qwen3", "deepseek_v3"));

// Long runs of one character: 256 KiB of spaces, letters, newlines. The regexes and BPE are
// linear / n log n in the run length, so this finishes in well under the CTest timeout; the
// result must still round-trip.
TEST(TokenizerLongRuns, RoundTrip) {
  auto t = Tokenizer::load(test::fixture_dir() + "/qwen3");
  ASSERT_TRUE(t.ok());
  for (const char ch : {' ', 'a', '\n'}) {
    const std::string text(256 * 1024, ch);
    auto ids = t->encode(text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(t->decode(*ids, false), text);
    EXPECT_LT(ids->size(), text.size());
  }
}

}  // namespace
}  // namespace xds

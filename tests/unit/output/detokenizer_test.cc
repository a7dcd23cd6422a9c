// Incremental detokenization against Tokenizer::decode of the whole sequence (random id
// sequences over the shipped model's and the published DeepSeek-V3 / Qwen3 tokenizers), and a
// character split over byte tokens derived by hand from the GPT-2 byte alphabet.
#include "output/detokenizer.h"

#include <gtest/gtest.h>

#include "output_test_util.h"
#include "tokenizer/utf8.h"

namespace xds::output {
namespace {

// GPT-2's byte -> unicode alphabet (the ByteLevel pre-tokenizer's), written independently of
// the tokenizer: printable Latin-1 bytes map to themselves, the rest to U+0100 onwards.
std::string byte_level_char(uint8_t b) {
  std::vector<int> printable;
  for (int c = '!'; c <= '~'; ++c) printable.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) printable.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) printable.push_back(c);
  int n = 0;
  char32_t cp = 0;
  for (int c = 0; c < 256; ++c) {
    const bool is_printable = std::find(printable.begin(), printable.end(), c) != printable.end();
    const char32_t mapped = is_printable ? c : 256 + n++;
    if (c == b) cp = mapped;
  }
  std::string out;
  utf8::append(&out, cp);
  return out;
}

class DetokenizerFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(DetokenizerFamily, RandomIdsMatchWholeDecode) {
  const Tokenizer& tok = test::tokenizer(GetParam());
  const int32_t vocab = static_cast<int32_t>(tok.vocab_size());
  // Ids whose bytes are not a whole character (parts of split characters), and added ids.
  std::vector<int32_t> partial, added;
  for (int32_t id = 0; id < vocab; ++id) {
    const std::string_view b = tok.token_bytes(id, false);
    if (!b.empty() && utf8::find_invalid(b) != std::string::npos) partial.push_back(id);
    if (tok.is_special(id)) added.push_back(id);
  }
  ASSERT_FALSE(partial.empty());
  ASSERT_FALSE(added.empty());
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any(0, vocab - 1);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int seq = 0; seq < 300; ++seq) {
    std::vector<int32_t> ids(1 + rng() % 40);
    for (int32_t& id : ids) {
      const int p = pick(rng);
      if (p < 4) {
        id = partial[rng() % partial.size()];
      } else if (p < 5) {
        id = added[rng() % added.size()];
      } else {
        id = any(rng);
      }
    }
    for (const bool skip : {true, false}) {
      Detokenizer d(tok, skip);
      std::string got;
      size_t i = 0;
      while (i < ids.size()) {  // appends of 1..4 ids
        const size_t n = std::min<size_t>(1 + rng() % 4, ids.size() - i);
        const std::string piece = d.append(std::span(ids).subspan(i, n));
        ASSERT_EQ(utf8::find_invalid(piece), std::string::npos) << "half a character emitted";
        got += piece;
        i += n;
      }
      got += d.finish();
      ASSERT_EQ(got, tok.decode(ids, skip)) << "sequence " << seq << " skip " << skip;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, DetokenizerFamily,
                         ::testing::Values("kjv", "deepseek_v3", "qwen3"));

TEST(Detokenizer, HoldsBackASplitCharacter) {
  const Tokenizer& tok = test::tokenizer("qwen3");
  // U+4F60 (你) is E4 BD A0; feed it one byte token at a time.
  std::vector<int32_t> ids;
  for (const uint8_t b : {0xE4, 0xBD, 0xA0}) {
    const auto id = tok.token_to_id(byte_level_char(b));
    ASSERT_TRUE(id.has_value()) << int(b);
    ids.push_back(*id);
  }
  Detokenizer d(tok, true);
  EXPECT_EQ(d.append_one(ids[0]), "");
  EXPECT_EQ(d.append_one(ids[1]), "");
  EXPECT_EQ(d.append_one(ids[2]), "\xE4\xBD\xA0");
  // A lead byte then an ASCII token: the lead byte can no longer complete -> U+FFFD.
  const auto a = tok.token_to_id("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(d.append_one(ids[0]), "");
  EXPECT_EQ(d.append_one(*a),
            "\xEF\xBF\xBD"
            "a");
  // An incomplete character at the end becomes U+FFFD.
  EXPECT_EQ(d.append_one(ids[0]), "");
  EXPECT_EQ(d.append_one(ids[1]), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
  // The text of a lone byte token (logprobs) is U+FFFD.
  EXPECT_EQ(d.token_text(ids[0]), "\xEF\xBF\xBD");
}

TEST(Detokenizer, SpecialTokens) {
  const Tokenizer& tok = test::tokenizer("qwen3");
  const auto im_end = tok.token_to_id("<|im_end|>");
  const auto think = tok.token_to_id("<think>");
  const auto hi = tok.token_to_id("hi");
  ASSERT_TRUE(im_end && think && hi);
  const std::vector<int32_t> ids = {*think, *hi, *im_end};
  Detokenizer skip(tok, true);
  EXPECT_EQ(skip.append(ids) + skip.finish(), "<think>hi");  // <think> is added, not special
  Detokenizer keep(tok, false);
  EXPECT_EQ(keep.append(ids) + keep.finish(), "<think>hi<|im_end|>");
  // Per-token texts show special tokens verbatim either way.
  EXPECT_EQ(skip.token_text(*im_end), "<|im_end|>");
  EXPECT_EQ(skip.token_text(*hi), "hi");
}

}  // namespace
}  // namespace xds::output

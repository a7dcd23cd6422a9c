// tiktoken.model (Kimi K2's tokenizer format): hand-derived merge orders on tiny rank files,
// Kimi's split pattern on hand-split texts, special ids and their names, streaming decode,
// loader errors; and one synthetic vocabulary loaded both as tiktoken.model and as the
// tokenizer.json that a converter (tiktoken_vocab.py, written from tiktoken's rule, not from
// this code) makes of it, giving the same ids on varied text.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/kimi_synthetic.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/tokenizer.h"

namespace xds {
namespace {

namespace fs = std::filesystem;

// A rank file: single bytes at rank = byte value, then `merged` tokens at ranks 256, 257, ...
std::string rank_file(const std::vector<std::string>& merged) {
  std::string out;
  for (int b = 0; b < 256; ++b) {
    out += base64_encode(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  }
  int rank = 256;
  for (const auto& t : merged) out += base64_encode(t) + " " + std::to_string(rank++) + "\n";
  return out;
}

std::vector<int32_t> encode_words(const TiktokenModel& m, const std::string& word) {
  std::vector<int32_t> ids;
  m.encode_word(word, &ids);
  return ids;
}

TEST(Tiktoken, Base64RoundTripsAndRejectsMalformedText) {
  // RFC 4648 section 10 test vectors.
  const std::pair<const char*, const char*> vectors[] = {
      {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : vectors) {
    EXPECT_EQ(base64_encode(plain), coded);
    EXPECT_EQ(base64_decode(coded), std::optional<std::string>(plain));
  }
  EXPECT_FALSE(base64_decode("Zm9").has_value());
  EXPECT_FALSE(base64_decode("Zm9*").has_value());
}

TEST(Tiktoken, MergesTheLowestRankedConcatenationFirst) {
  // "bc" (256) ranks below "ab" (257): "abcd" -> a, bc, d.
  auto m1 = TiktokenModel::parse(rank_file({"bc", "ab"}), "t1");
  ASSERT_TRUE(m1.ok()) << m1.status().to_string();
  EXPECT_EQ(encode_words(*m1, "abcd"), (std::vector<int32_t>{'a', 256, 'd'}));
  // "ab" (256) below "bc" (257): ab, c, d.
  auto m2 = TiktokenModel::parse(rank_file({"ab", "bc"}), "t2");
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(encode_words(*m2, "abcd"), (std::vector<int32_t>{256, 'c', 'd'}));
  // Equal ranks: the leftmost pair. "aaa" -> aa, a.
  auto m3 = TiktokenModel::parse(rank_file({"aa"}), "t3");
  ASSERT_TRUE(m3.ok());
  EXPECT_EQ(encode_words(*m3, "aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(encode_words(*m3, "aaaa"), (std::vector<int32_t>{256, 256}));
}

TEST(Tiktoken, MergesByTheRankOfTheConcatenationWhateverItsParts) {
  // "bc" 256, "abc" 257, "ab" 258. "abcz": pairs ab (258), bc (256) -> a, bc, z; then a+bc is
  // "abc" (257) -> abc, z. No merge list says "a + bc": the concatenation's rank decides.
  auto m = TiktokenModel::parse(rank_file({"bc", "abc", "ab"}), "t");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(encode_words(*m, "abcz"), (std::vector<int32_t>{257, 'z'}));
  // "ab" 256, "cd" 257, "abcd" 258: "abcde" -> ab, cd -> abcd, e.
  auto m2 = TiktokenModel::parse(rank_file({"ab", "cd", "abcd"}), "t2");
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(encode_words(*m2, "abcde"), (std::vector<int32_t>{258, 'e'}));
}

TEST(Tiktoken, AWordThatIsATokenIsThatToken) {
  // "xaby" (257) cannot be reached by merges (no "xab", "aby", "xa", "by"), but tiktoken looks
  // the whole word up first. One more byte and the merges decide.
  auto m = TiktokenModel::parse(rank_file({"ab", "xaby"}), "t");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(encode_words(*m, "xaby"), (std::vector<int32_t>{257}));
  EXPECT_EQ(encode_words(*m, "xabyz"), (std::vector<int32_t>{'x', 256, 'y', 'z'}));
}

TEST(Tiktoken, LoaderErrorsNameTheLine) {
  const std::string base = rank_file({});
  auto expect_error = [](const std::string& text, const std::string& needle) {
    auto r = TiktokenModel::parse(text, "dir/tiktoken.model");
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().to_string().find(needle), std::string::npos) << r.status().to_string();
  };
  expect_error(base + "YWI= 300\n", "line 257: rank 300 is not below the number of tokens 257");
  expect_error(base + "YWI= 5\n", "line 257: rank 5 appears twice");
  expect_error(base + "YWI 256\n", "line 257: \"YWI\" is not base64");
  expect_error(base + "YWI= x\n", "line 257: rank \"x\" is not an integer");
  expect_error(base + "YWI=\n", "line 257: expected \"BASE64 RANK\"");
  expect_error(base + "YQ== 256\n", "token YQ== appears twice");
  // Byte 0x41 ('A') missing: the other 255 bytes keep ranks 0..254.
  std::string no_a;
  int rank = 0;
  for (int b = 0; b < 256; ++b) {
    if (b == 'A') continue;
    no_a += base64_encode(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  }
  expect_error(no_a, "byte 0x41 is not a token");
  expect_error("", "no tokens");
}

std::vector<std::string> kimi_split(const std::string& text) {
  nlohmann::json split = {{"type", "Split"}, {"behavior", "Isolated"}, {"invert", false}};
  split["pattern"]["Regex"] = std::string(kKimiSplitPattern);
  auto pt = PreTokenizer::from_json(split, "test", "pre_tokenizer");
  EXPECT_TRUE(pt.ok()) << pt.status().to_string();
  std::vector<std::string> words;
  EXPECT_TRUE(pt->apply(text, &words).ok());
  return words;
}

TEST(Tiktoken, KimiSplitPatternSeparatesHanAndFollowsTheGpt4Branches) {
  using V = std::vector<std::string>;
  // Han runs are words of their own; the letter branches exclude Han.
  EXPECT_EQ(kimi_split("中文English混合"), (V{"中文", "English", "混合"}));
  EXPECT_EQ(kimi_split("北京市 Pascal"), (V{"北京市", " Pascal"}));
  EXPECT_EQ(kimi_split("Hello世界"), (V{"Hello", "世界"}));
  // Contractions after a capitalised or all-capital word; digits in threes.
  EXPECT_EQ(kimi_split("I'm 12345 ok"), (V{"I'm", " ", "123", "45", " ok"}));
  EXPECT_EQ(kimi_split("DON'T"), (V{"DON'T"}));
  // Whitespace: a run before a word leaves its last space to the word; newlines together.
  EXPECT_EQ(kimi_split("  hello\n\nworld"), (V{" ", " hello", "\n\n", "world"}));
  // Symbols (emoji) run together; punctuation takes the newlines after it.
  EXPECT_EQ(kimi_split("a😀😀b"), (V{"a", "😀😀", "b"}));
  EXPECT_EQ(kimi_split("x = 1;\n"), (V{"x", " =", " ", "1", ";\n"}));
  // Hiragana is a letter but not Han: the letter branch takes it.
  EXPECT_EQ(kimi_split("日本語のテキスト"), (V{"日本語", "のテキスト"}));
}

// The synthetic vocabulary of tiktoken_vocab.py, written once per test binary.
class TiktokenVsTokenizerJson : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((fs::path(::testing::TempDir()) /
                            ("tiktoken_vocab_" + std::to_string(::getpid())))
                               .string());
    fs::create_directories(*dir_);
    std::ofstream(fs::path(*dir_) / "pattern.txt") << kKimiSplitPattern;
    const std::string cmd = std::string("/usr/bin/python3 ") + XDS_SOURCE_DIR +
                            "/tests/unit/tokenizer/tiktoken_vocab.py " + *dir_;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
};
std::string* TiktokenVsTokenizerJson::dir_ = nullptr;

const char* const kVariedTexts[] = {
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure THEY'RE here; we'd KNOW it, wouldn't we?",
    "中文分词和汉字的处理在北京很常见。",
    "中文English混合テキスト와 한국어",
    "Emoji 😀😀 👍🏽 🇺🇸 ❤️ ok",
    "numbers 1234567890 3.14159 2024-12-31 0.001% 1,000,000",
    "    four spaces\t\ttabs\n\n\nnewlines   \r\n  crlf",
    "def encode(self, text):\n    return [self.ranks[b] for b in text]  # comment\n",
    "Ελληνικά και Русский текст, café naïve résumé",
    "unseen words: zyzzyva quixotic 镊子 ξ",
    "",
    " ",
    "\n",
    "a<|im_end|>b[BOS] [EOS]<|im_user|>user<|im_middle|>hi",
};

TEST_F(TiktokenVsTokenizerJson, SameIdsDecodesAndSpecialTokensOnVariedText) {
  auto tt = Tokenizer::load((fs::path(*dir_) / "tt").string());
  ASSERT_TRUE(tt.ok()) << tt.status().to_string();
  auto hf = Tokenizer::load((fs::path(*dir_) / "hf").string());
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  EXPECT_EQ(tt->vocab_size(), hf->vocab_size());
  const int32_t first_special = static_cast<int32_t>(tt->vocab_size()) - kKimiNumSpecialTokens;
  EXPECT_EQ(tt->bos_id(), std::optional<int32_t>(first_special));
  EXPECT_EQ(tt->eos_id(), std::optional<int32_t>(first_special + 1));
  EXPECT_EQ(tt->token_to_id("<|im_end|>"), std::optional<int32_t>(first_special + 2));
  EXPECT_EQ(tt->token_to_id("<|im_middle|>"), std::optional<int32_t>(first_special + 17));
  EXPECT_EQ(tt->id_to_token(first_special + 5),
            std::optional<std::string>("<|reserved_token_" + std::to_string(first_special + 5) + "|>"));
  EXPECT_FALSE(tt->adds_bos());
  for (const char* text : kVariedTexts) {
    SCOPED_TRACE(text);
    auto a = tt->encode(text, true);
    auto b = hf->encode(text, true);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    EXPECT_EQ(tt->decode(*a, false), text);
    EXPECT_EQ(tt->decode(*a, true), hf->decode(*b, true));
    // Byte-level token names agree with tokenizer.json's vocabulary.
    for (const int32_t id : *a) EXPECT_EQ(tt->id_to_token(id), hf->id_to_token(id));
  }
  // The trained merges are in use: the training sentence is whole words, far fewer ids than
  // bytes; a word never seen falls back towards single bytes.
  auto trained = tt->encode(std::string(kVariedTexts[0]), false);
  ASSERT_TRUE(trained.ok());
  EXPECT_LE(trained->size(), 12u);  // 9 words and the period at most, give or take a split
  auto unseen = tt->encode(std::string("zyzzyva"), false);
  ASSERT_TRUE(unseen.ok());
  EXPECT_GE(unseen->size(), 4u);
  // The special tokens are ids, not text; skipped on request.
  auto ids = tt->encode("a<|im_end|>b", false);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 3u);
  EXPECT_EQ((*ids)[1], first_special + 2);
  EXPECT_EQ(tt->decode(*ids, true), "ab");
}

TEST_F(TiktokenVsTokenizerJson, StreamingDecodeHoldsBackPartialCharacters) {
  auto tt = Tokenizer::load((fs::path(*dir_) / "tt").string());
  ASSERT_TRUE(tt.ok());
  // 镊 (E9 95 8A) is not in the training text: three single-byte tokens.
  auto ids = tt->encode("镊", false);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 3u);
  IncrementalDetokenizer d(*tt);
  EXPECT_EQ(d.push((*ids)[0]), "");
  EXPECT_EQ(d.push((*ids)[1]), "");
  EXPECT_EQ(d.push((*ids)[2]), "镊");
  for (const char* text : kVariedTexts) {
    auto all = tt->encode(text, false);
    ASSERT_TRUE(all.ok());
    std::string streamed;
    for (const int32_t id : *all) streamed += d.push(id);
    streamed += d.flush();
    EXPECT_EQ(streamed, tt->decode(*all, true)) << text;
  }
}

TEST(Tiktoken, ConfigErrorsNameTheField) {
  const std::string model = rank_file({"ab"});
  auto r = Tokenizer::from_tiktoken_text(
      model, R"({"added_tokens_decoder": {"12": {"content": "[BOS]"}}})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("'added_tokens_decoder.12': id 12 is outside the special "
                                        "ids [257, 515)"),
            std::string::npos)
      << r.status().to_string();
  r = Tokenizer::from_tiktoken_text(
      model, R"({"added_tokens_decoder": {"257": {"content": "X"}, "258": {"content": "X"}}})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("\"X\" names two ids (the second is 258)"),
            std::string::npos);
  r = Tokenizer::from_tiktoken_text(model, R"({"add_bos_token": true, "bos_token": "<s>"})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("add_bos_token"), std::string::npos);
  // Without a config: every special id is reserved, BOS / EOS unknown.
  r = Tokenizer::from_tiktoken_text(model, "");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->vocab_size(), 257 + 258);
  EXPECT_EQ(r->token_to_id("<|reserved_token_300|>"), std::optional<int32_t>(300));
  EXPECT_FALSE(r->bos_id().has_value());
}

TEST(KimiSynthetic, WritesALoadableTokenizerWithKimisSpecialIds) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("kimi_synth_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const int64_t vocab = 2048;
  ASSERT_TRUE(write_kimi_synthetic_tokenizer(dir.string(), vocab, 7).ok());
  auto tok = Tokenizer::load(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  // The published offsets: [BOS] at V - 256, ..., [PAD] at V - 1; two reserved ids past V.
  EXPECT_EQ(tok->vocab_size(), vocab + 2);
  EXPECT_EQ(tok->bos_id(), std::optional<int32_t>(vocab - 256));
  EXPECT_EQ(tok->eos_id(), std::optional<int32_t>(vocab - 255));
  const std::pair<const char*, int64_t> offsets[] = {
      {"<|im_end|>", 2},           {"<|im_user|>", 3},           {"<|im_assistant|>", 4},
      {"<|im_system|>", 10},       {"<|tool_calls_section_begin|>", 11},
      {"<|tool_calls_section_end|>", 12}, {"<|tool_call_begin|>", 13},
      {"<|tool_call_argument_begin|>", 14}, {"<|tool_call_end|>", 15},
      {"<|im_middle|>", 17},       {"[UNK]", 254},               {"[PAD]", 255}};
  for (const auto& [name, off] : offsets) {
    EXPECT_EQ(tok->token_to_id(name), std::optional<int32_t>(vocab - 256 + off)) << name;
    EXPECT_TRUE(tok->is_special(static_cast<int32_t>(vocab - 256 + off)));
  }
  // Round trip of varied text; the same seed writes the same bytes, another seed others.
  for (const char* text : kVariedTexts) {
    auto ids = tok->encode(text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(tok->decode(*ids, false), text);
  }
  auto read = [](const fs::path& p) {
    std::stringstream ss;
    ss << std::ifstream(p).rdbuf();
    return ss.str();
  };
  const std::string first = read(dir / "tiktoken.model");
  ASSERT_TRUE(write_kimi_synthetic_tokenizer(dir.string(), vocab, 7).ok());
  EXPECT_EQ(read(dir / "tiktoken.model"), first);
  ASSERT_TRUE(write_kimi_synthetic_tokenizer(dir.string(), vocab, 8).ok());
  EXPECT_NE(read(dir / "tiktoken.model"), first);
  EXPECT_FALSE(write_kimi_synthetic_tokenizer(dir.string(), 1000, 7).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace xds

// Small hand-written tokenizer.json files with hand-derived expected ids: merge ranks, both
// published merge forms, added-token options, byte fallback, Split behaviours (the examples of
// the Hugging Face tokenizers documentation), and loader errors naming the file and field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace xds {
namespace {

// Byte-level vocabulary: byte b has id b; merges as given (ids 256.. in order of `merged`).
nlohmann::json byte_level_json(const std::vector<std::pair<std::string, std::string>>& merges,
                               bool pair_form) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode_bytes(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json m = nlohmann::json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    const std::string ea = byte_level::encode_bytes(a), eb = byte_level::encode_bytes(b);
    if (!vocab.contains(ea + eb)) vocab[ea + eb] = next++;
    if (pair_form) m.push_back({ea, eb});
    else m.push_back(ea + " " + eb);
  }
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

std::vector<int32_t> enc(const Tokenizer& t, const std::string& s) {
  auto r = t.encode(s, false);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<int32_t>{};
}

TEST(Bpe, MergesByRankInBothPublishedForms) {
  // Ranks: "e l"=0 (id 256), "l l"=1 (257), "h el"=2 (258), "hel l"=3 (259), "hell o"=4 (260).
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"e", "l"}, {"l", "l"}, {"h", "el"}, {"hel", "l"}, {"hell", "o"}};
  for (const bool pair_form : {false, true}) {
    auto t = Tokenizer::from_json_text(byte_level_json(merges, pair_form).dump(), "");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(enc(*t, "hello"), (std::vector<int32_t>{260}));
    // "ell": "e l" (rank 0) wins over "l l" (rank 1) -> [el, l].
    EXPECT_EQ(enc(*t, "ell"), (std::vector<int32_t>{256, 'l'}));
    // "lll": "l l" leftmost first -> [ll, l].
    EXPECT_EQ(enc(*t, "lll"), (std::vector<int32_t>{257, 'l'}));
    EXPECT_EQ(enc(*t, ""), std::vector<int32_t>{});
    // A word longer than the small-word path (heap merge) gives the same as repeating it.
    std::string longw;
    std::vector<int32_t> want;
    for (int k = 0; k < 20; ++k) {
      longw += "hello";
      want.push_back(260);
    }
    EXPECT_EQ(enc(*t, longw), want);
    EXPECT_EQ(t->decode(want, false), longw);
  }
}

TEST(Bpe, AddedTokensStripAndSpecialFlags) {
  auto j = byte_level_json({}, false);
  j["added_tokens"] = {
      {{"id", 300}, {"content", "<x>"}, {"special", true}, {"lstrip", true}, {"rstrip", false}, {"normalized", false}},
      {{"id", 301}, {"content", "<y>"}, {"special", false}, {"lstrip", false}, {"rstrip", true}, {"normalized", false}},
      {{"id", 302}, {"content", "<x>>"}, {"special", true}, {"normalized", false}}};
  auto t = Tokenizer::from_json_text(j.dump(), "");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(enc(*t, "a <x> b"), (std::vector<int32_t>{'a', 300, ' ', 'b'}));  // lstrip eats " "
  EXPECT_EQ(enc(*t, "a <y>  b"), (std::vector<int32_t>{'a', ' ', 301, 'b'}));  // rstrip eats "  "
  EXPECT_EQ(enc(*t, "<x>>"), (std::vector<int32_t>{302}));                     // longest match
  EXPECT_EQ(t->vocab_size(), 303);
  EXPECT_TRUE(t->is_special(300));
  EXPECT_FALSE(t->is_special(301));
  EXPECT_EQ(t->decode(std::vector<int32_t>{'a', 300, 301}, false), "a<x><y>");
  EXPECT_EQ(t->decode(std::vector<int32_t>{'a', 300, 301}, true), "a<y>");
}

TEST(Bpe, TemplatePostProcessorAndConfigBos) {
  auto j = byte_level_json({}, false);
  j["added_tokens"] = {{{"id", 256}, {"content", "<s>"}, {"special", true}},
                       {{"id", 257}, {"content", "</s>"}, {"special", true}}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                     {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}},
                                             {"</s>", {{"id", "</s>"}, {"ids", {257}}, {"tokens", {"</s>"}}}}}}};
  auto t = Tokenizer::from_json_text(j.dump(), R"({"bos_token": "<s>", "eos_token": "</s>"})");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->encode("a", true), (std::vector<int32_t>{256, 'a', 257}));
  EXPECT_EQ(*t->encode("a", false), (std::vector<int32_t>{'a'}));
  // tokenizer_config.json's add_bos_token / add_eos_token replace the post-processor.
  auto t2 = Tokenizer::from_json_text(j.dump(), R"({"bos_token": {"content": "<s>"}, "add_bos_token": true, "add_eos_token": false})");
  ASSERT_TRUE(t2.ok()) << t2.status().to_string();
  EXPECT_EQ(*t2->encode("a", true), (std::vector<int32_t>{256, 'a'}));
  EXPECT_TRUE(t2->adds_bos());
}

TEST(Bpe, ByteFallbackStreamsSplitCharacters) {
  // SentencePiece-style: characters, <0xXX> byte fallback, "▁" for spaces, Strip of one space.
  nlohmann::json vocab = {{"<unk>", 0}, {"<0xE4>", 1}, {"<0xBD>", 2}, {"<0xA0>", 3}, {"\xE2\x96\x81", 4},
                          {"h", 5}, {"i", 6}, {"\xE2\x96\x81h", 7}, {"\xE2\x96\x81hi", 8}};
  nlohmann::json j = {
      {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                                             {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                                       {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                                       {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"byte_fallback", true}, {"unk_token", "<unk>"},
                 {"merges", {"\xE2\x96\x81 h", "\xE2\x96\x81h i"}}}}};
  auto t = Tokenizer::from_json_text(j.dump(), "");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // "hi你" -> prepend "▁" -> "▁hi你": merges give "▁hi", "你" falls back to its 3 bytes.
  EXPECT_EQ(enc(*t, "hi你"), (std::vector<int32_t>{8, 1, 2, 3}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{8, 1, 2, 3}, false), "hi你");
  IncrementalDetokenizer d(*t);
  EXPECT_EQ(d.push(8), "hi");
  EXPECT_EQ(d.push(1), "");  // first byte of 你 held back
  EXPECT_EQ(d.push(2), "");
  EXPECT_EQ(d.push(3), "你");
  EXPECT_EQ(d.push(1), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");  // an incomplete final character becomes U+FFFD
  EXPECT_EQ(t->decode(std::vector<int32_t>{1, 5}, false), "\xEF\xBF\xBDh");  // as decode does
}

TEST(Utf8, MaximalSubpartReplacement) {
  // Unicode 15 ch. 3 "U+FFFD substitution of maximal subparts" examples.
  EXPECT_EQ(utf8::replace_invalid("a\xF1\x80\x80\xE1\x80\xC2" "b"), "a\uFFFD\uFFFD\uFFFDb");
  EXPECT_EQ(utf8::replace_invalid("\xC0\xAF"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8::replace_invalid("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(utf8::find_invalid("ok\xFF"), 2u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE4\xBD"), 2u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE4\xBD\xA0"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("\xC0"), 0u);  // can never complete
}

TEST(PreTokenizer, SplitBehaviorsFromTheDocumentation) {
  // "the-final--countdown" split on '-' (tokenizers docs, SplitDelimiterBehavior).
  const std::string s = "the-final--countdown";
  auto run = [&](const char* behavior) {
    auto p = PreTokenizer::from_json({{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}}, "t", "p");
    EXPECT_TRUE(p.ok());
    std::vector<std::string> w;
    EXPECT_TRUE(p->apply(s, &w).ok());
    return w;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(run("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(run("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(run("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(run("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(run("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
  // invert: the pattern describes the pieces to keep.
  auto inv = PreTokenizer::from_json({{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Removed"}, {"invert", true}}, "t", "p");
  ASSERT_TRUE(inv.ok());
  std::vector<std::string> w;
  ASSERT_TRUE(inv->apply("ab, cd!", &w).ok());
  EXPECT_EQ(w, (V{"ab", "cd"}));
}

TEST(TokenizerLoad, ErrorsNameFileAndField) {
  auto err = [](const std::string& tj) {
    auto t = Tokenizer::from_json_text(tj, "", "dir/tokenizer.json");
    return t.ok() ? std::string("OK") : t.status().message();
  };
  EXPECT_NE(err("{\"model\": ").find("dir/tokenizer.json: invalid JSON"), std::string::npos);
  auto j = byte_level_json({{"a", "b"}}, false);
  j["model"]["type"] = "Unigram";
  EXPECT_NE(err(j.dump()).find("field 'model.type': model type \"Unigram\""), std::string::npos) << err(j.dump());
  j = byte_level_json({{"a", "b"}}, false);
  j["model"].erase("merges");
  EXPECT_NE(err(j.dump()).find("field 'model.merges': missing"), std::string::npos);
  j = byte_level_json({{"a", "b"}}, false);
  j["model"]["merges"].push_back("a zz");
  EXPECT_NE(err(j.dump()).find("field 'model.merges[1]'"), std::string::npos) << err(j.dump());
  j = byte_level_json({}, false);
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Metaspace2"}}}}};
  EXPECT_NE(err(j.dump()).find("field 'pre_tokenizer.pretokenizers[0].type'"), std::string::npos) << err(j.dump());
  j = byte_level_json({}, false);
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(err(j.dump()).find("regex '(unclosed'"), std::string::npos) << err(j.dump());
  j = byte_level_json({}, false);
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(err(j.dump()).find("field 'normalizer.type'"), std::string::npos) << err(j.dump());
  auto missing = Tokenizer::load("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model/tokenizer.json"), std::string::npos);
  EXPECT_FALSE(Tokenizer::has_tokenizer_files("/nonexistent/model"));
}

}  // namespace
}  // namespace xds

// Reasoning / content separation on fixed model texts; every text is also fed in random
// pieces, which must give the same split as one push (the expected splits are written by
// hand from the <think>...</think> rule).
#include "output/reasoning_parser.h"

#include <gtest/gtest.h>

#include "output_test_util.h"

namespace xds::output {
namespace {

ReasoningSplit run(const std::vector<std::string>& pieces, bool starts_inside,
                   std::string_view kind = "deepseek_r1") {
  auto p = ReasoningParser::create(kind, starts_inside);
  EXPECT_TRUE(p.ok());
  ReasoningSplit all;
  for (const std::string& s : pieces) {
    ReasoningSplit r = p->push(s);
    all.reasoning += r.reasoning;
    all.content += r.content;
  }
  ReasoningSplit r = p->finish();
  all.reasoning += r.reasoning;
  all.content += r.content;
  return all;
}

struct Case {
  std::string text;
  bool starts_inside;
  std::string reasoning;
  std::string content;
};

const Case kCases[] = {
    // DeepSeek-R1: the prompt opened <think>, the output closes it.
    {"Let me add 2 and 2.\n</think>\n\nThe answer is 4.", true, "Let me add 2 and 2.\n",
     "The answer is 4."},
    // Qwen3 with thinking: the output opens and closes the tag.
    {"<think>\nhmm\n</think>\n\n4", false, "\nhmm\n", "4"},
    // No reasoning at all.
    {"Just an answer.", false, "", "Just an answer."},
    // Cut inside the reasoning (max_tokens): everything is reasoning.
    {"thinking and thinking </thi", true, "thinking and thinking </thi", ""},
    {"<think>still thinking", false, "still thinking", ""},
    // A tag that is not at the start is plain content.
    {"a <think>b</think> c", false, "", "a <think>b</think> c"},
    // Content that begins like the tag but is not.
    {"<thinking> is a word", false, "", "<thinking> is a word"},
    {"<thi", false, "", "<thi"},
    // A second </think> after the first is content.
    {"r</think>c</think>", true, "r", "c</think>"},
    // Empty reasoning.
    {"<think></think>ok", false, "", "ok"},
    {"", true, "", ""},
};

TEST(ReasoningParser, FixedTextsOnePush) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.text);
    const ReasoningSplit r = run({c.text}, c.starts_inside);
    EXPECT_EQ(r.reasoning, c.reasoning);
    EXPECT_EQ(r.content, c.content);
  }
}

TEST(ReasoningParser, FixedTextsRandomPieces) {
  std::mt19937 rng(3);
  for (const Case& c : kCases) {
    for (int trial = 0; trial < 50; ++trial) {
      SCOPED_TRACE(c.text);
      const ReasoningSplit r = run(test::random_split(c.text, rng, 4), c.starts_inside, "qwen3");
      ASSERT_EQ(r.reasoning, c.reasoning);
      ASSERT_EQ(r.content, c.content);
    }
  }
}

TEST(ReasoningParser, HoldsBackASplitTag) {
  auto p = ReasoningParser::create("deepseek_r1", true);
  ASSERT_TRUE(p.ok());
  ReasoningSplit a = p->push("abc</th");
  EXPECT_EQ(a.reasoning, "abc");
  EXPECT_EQ(a.content, "");
  EXPECT_TRUE(p->in_reasoning());
  ReasoningSplit b = p->push("ink>\n\nHi");
  EXPECT_EQ(b.reasoning, "");
  EXPECT_EQ(b.content, "Hi");
  EXPECT_FALSE(p->in_reasoning());
}

TEST(ReasoningParser, UnknownKind) {
  auto p = ReasoningParser::create("mistral", false);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("'mistral'"), std::string::npos);
}

}  // namespace
}  // namespace xds::output

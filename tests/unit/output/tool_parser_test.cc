// Tool-call parsing on fixed model texts in the DeepSeek-V3, Qwen3 and Kimi K2 formats (the markers
// spelled as in the published chat templates); each text also in random pieces, which must
// give the same content and calls as one push. Expected values are written by hand.
#include "output/tool_parser.h"

#include <array>
#include <set>

#include <gtest/gtest.h>

#include "output_test_util.h"

namespace xds::output {
namespace {

using protocol::ToolCall;

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

Parsed run(std::string_view kind, const std::vector<std::string>& pieces, uint64_t seed = 1) {
  auto p = ToolParser::create(kind, seed);
  EXPECT_TRUE(p.ok());
  Parsed all;
  for (const std::string& s : pieces) {
    ToolSplit t = p->push(s);
    all.content += t.content;
    for (ToolCall& c : t.calls) all.calls.push_back(std::move(c));
  }
  ToolSplit t = p->finish();
  all.content += t.content;
  for (ToolCall& c : t.calls) all.calls.push_back(std::move(c));
  return all;
}

struct Case {
  std::string kind;
  std::string text;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

const std::string kDsBegin = "<｜tool▁calls▁begin｜>";
const std::string kDsEnd = "<｜tool▁calls▁end｜>";
const std::string kDsCall = "<｜tool▁call▁begin｜>";
const std::string kDsCallEnd = "<｜tool▁call▁end｜>";
const std::string kDsSep = "<｜tool▁sep｜>";

std::string ds_call(const std::string& name, const std::string& args) {
  return kDsCall + "function" + kDsSep + name + "\n```json\n" + args + "\n```" + kDsCallEnd;
}

std::vector<Case> cases() {
  return {
      // DeepSeek-V3: one call after some content.
      {"deepseek_v3",
       "Let me check." + kDsBegin + ds_call("get_weather", R"({"city": "Paris"})") + kDsEnd,
       "Let me check.",
       {{"get_weather", R"({"city": "Paris"})"}}},
      // Two calls, separated by a newline as the template writes them.
      {"deepseek_v3",
       kDsBegin + ds_call("a", R"({"x": 1})") + "\n" + ds_call("b", R"({"y": [1, 2]})") + kDsEnd,
       "",
       {{"a", R"({"x": 1})"}, {"b", R"({"y": [1, 2]})"}}},
      // V3.1 body: NAME<sep>ARGS.
      {"deepseek_v3",
       kDsBegin + kDsCall + "f" + kDsSep + R"({"k": "v"})" + kDsCallEnd + kDsEnd,
       "",
       {{"f", R"({"k": "v"})"}}},
      // Malformed arguments: the call stays content, verbatim.
      {"deepseek_v3",
       "x" + kDsBegin + ds_call("bad", "{not json") + kDsEnd,
       "x" + kDsBegin + ds_call("bad", "{not json") + kDsEnd,
       {}},
      // Unfinished call at the end (max_tokens): content, markers included.
      {"deepseek_v3",
       "y" + kDsBegin + kDsCall + "function" + kDsSep + "f\n```json\n{\"a\"",
       "y" + kDsBegin + kDsCall + "function" + kDsSep + "f\n```json\n{\"a\"",
       {}},
      // Text that is not a call.
      {"deepseek_v3", "plain <｜tool text", "plain <｜tool text", {}},
      // Qwen3: content, then two calls.
      {"qwen3",
       "I will call two tools.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
       "{\"tz\": \"UTC\", \"fmt\": \"iso\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", "
       "\"arguments\": {}}\n</tool_call>",
       "I will call two tools.\n",
       {{"get_time", R"({"tz":"UTC","fmt":"iso"})"}, {"noop", "{}"}}},
      // Arguments given as a JSON string.
      {"qwen3",
       "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
       "",
       {{"f", R"({"a": 1})"}}},
      // No name: content.
      {"qwen3",
       "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
       {}},
      // Text after the calls stays content.
      {"qwen3", "<tool_call>{\"name\": \"f\"}</tool_call>\nDone.", "\nDone.", {{"f", "{}"}}},
      // Unfinished.
      {"qwen3", "a<tool_call>{\"name\"", "a<tool_call>{\"name\"", {}},
      {"qwen3", "a <tool_ca", "a <tool_ca", {}},
  };
}

void expect_parsed(const Parsed& got, const Case& c) {
  EXPECT_EQ(got.content, c.content);
  ASSERT_EQ(got.calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, c.calls[i].first);
    EXPECT_EQ(got.calls[i].arguments, c.calls[i].second);
    EXPECT_TRUE(got.calls[i].id.starts_with("call_")) << got.calls[i].id;
    EXPECT_EQ(got.calls[i].id.size(), 5u + 24u);
  }
}

TEST(ToolParser, FixedTextsOnePush) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.text);
    expect_parsed(run(c.kind, {c.text}), c);
  }
}

TEST(ToolParser, FixedTextsRandomPieces) {
  std::mt19937 rng(11);
  for (const Case& c : cases()) {
    for (int trial = 0; trial < 40; ++trial) {
      SCOPED_TRACE(c.text);
      expect_parsed(run(c.kind, test::random_split(c.text, rng, 6)), c);
    }
  }
}

TEST(ToolParser, ContentIsReleasedBeforeTheCallCompletes) {
  auto p = ToolParser::create("qwen3", 5);
  ASSERT_TRUE(p.ok());
  ToolSplit a = p->push("Sure.<tool_");
  EXPECT_EQ(a.content, "Sure.");  // "<tool_" may be a marker: held
  ToolSplit b = p->push("call>{\"name\": \"f\", ");
  EXPECT_EQ(b.content, "");
  EXPECT_TRUE(b.calls.empty());
  ToolSplit c = p->push("\"arguments\": {\"q\": 1}}</tool_call>");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].arguments, R"({"q":1})");
  EXPECT_EQ(p->num_calls(), 1);
}

TEST(ToolParser, IdsAreUniquePerSeedAndCall) {
  std::set<std::string> ids;
  const std::string text =
      "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>";
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (const ToolCall& c : run("qwen3", {text}, seed).calls) ids.insert(c.id);
  }
  EXPECT_EQ(ids.size(), 100u);
}

// Kimi K2: the markers of its chat template; the call's id is the model's "functions.NAME:IDX".
const std::string kKimiBegin = "<|tool_calls_section_begin|>";
const std::string kKimiEnd = "<|tool_calls_section_end|>";
const std::string kKimiCall = "<|tool_call_begin|>";
const std::string kKimiArg = "<|tool_call_argument_begin|>";
const std::string kKimiCallEnd = "<|tool_call_end|>";

std::string kimi_call(const std::string& id, const std::string& args) {
  return kKimiCall + id + kKimiArg + args + kKimiCallEnd;
}

struct KimiCase {
  std::string text;
  std::string content;
  std::vector<std::array<std::string, 3>> calls;  // id, name, arguments
};

std::vector<KimiCase> kimi_cases() {
  return {
      // Content, then one call in a section.
      {"Let me look that up." + kKimiBegin +
           kimi_call("functions.get_weather:0", R"({"city": "Paris"})") + kKimiEnd,
       "Let me look that up.",
       {{"functions.get_weather:0", "get_weather", R"({"city": "Paris"})"}}},
      // Two calls; whitespace around the id and the arguments, as models sometimes write.
      {kKimiBegin + kimi_call(" functions.search:0 ", " {\"q\": \"中文\"} ") +
           kimi_call("functions.fetch_url:1", R"({"url": "https://x.org", "n": [1, 2]})") +
           kKimiEnd,
       "",
       {{"functions.search:0", "search", R"({"q": "中文"})"},
        {"functions.fetch_url:1", "fetch_url", R"({"url": "https://x.org", "n": [1, 2]})"}}},
      // Text after the section stays content.
      {kKimiBegin + kimi_call("functions.f:0", "{}") + kKimiEnd + "\nDone.",
       "\nDone.",
       {{"functions.f:0", "f", "{}"}}},
      // Malformed: arguments that are not JSON; no argument marker; no index. Content, verbatim.
      {"x" + kKimiBegin + kimi_call("functions.bad:0", "{not json") + kKimiEnd,
       "x" + kKimiBegin + kimi_call("functions.bad:0", "{not json") + kKimiEnd,
       {}},
      {kKimiBegin + kKimiCall + "functions.f:0 {}" + kKimiCallEnd + kKimiEnd,
       kKimiBegin + kKimiCall + "functions.f:0 {}" + kKimiCallEnd + kKimiEnd,
       {}},
      {kKimiBegin + kimi_call("functions.f", "{}") + kKimiEnd,
       kKimiBegin + kimi_call("functions.f", "{}") + kKimiEnd,
       {}},
      // One good call and one bad: the good one parses, the bad one stays text.
      {kKimiBegin + kimi_call("functions.a:0", R"({"k": 1})") + kimi_call("functions.b:1", "[1]") +
           kKimiEnd,
       kimi_call("functions.b:1", "[1]") + kKimiEnd,
       {{"functions.a:0", "a", R"({"k": 1})"}}},
      // Unfinished at the end (max_tokens): content, markers included.
      {"y" + kKimiBegin + kKimiCall + "functions.f:0" + kKimiArg + "{\"a\"",
       "y" + kKimiBegin + kKimiCall + "functions.f:0" + kKimiArg + "{\"a\"",
       {}},
      // Look-alike text.
      {"plain <|tool text <|tool_call", "plain <|tool text <|tool_call", {}},
  };
}

void expect_kimi(const Parsed& got, const KimiCase& c) {
  EXPECT_EQ(got.content, c.content);
  ASSERT_EQ(got.calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].id, c.calls[i][0]);
    EXPECT_EQ(got.calls[i].name, c.calls[i][1]);
    EXPECT_EQ(got.calls[i].arguments, c.calls[i][2]);
  }
}

TEST(ToolParser, KimiK2OnePushAndRandomPieces) {
  std::mt19937 rng(23);
  for (const KimiCase& c : kimi_cases()) {
    SCOPED_TRACE(c.text);
    expect_kimi(run("kimi_k2", {c.text}), c);
    for (int trial = 0; trial < 40; ++trial) {
      expect_kimi(run("kimi_k2", test::random_split(c.text, rng, 6)), c);
    }
    // One byte at a time: every marker arrives split.
    std::vector<std::string> bytes;
    for (const char ch : c.text) bytes.emplace_back(1, ch);
    expect_kimi(run("kimi_k2", bytes), c);
  }
}

TEST(ToolParser, KimiK2ReleasesContentBeforeTheCallCompletes) {
  auto p = ToolParser::create("kimi_k2", 5);
  ASSERT_TRUE(p.ok());
  ToolSplit a = p->push("Sure.<|tool_calls");
  EXPECT_EQ(a.content, "Sure.");  // "<|tool_calls" may start a marker: held
  ToolSplit b = p->push("_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_arg");
  EXPECT_EQ(b.content, "");
  EXPECT_TRUE(b.calls.empty());
  ToolSplit c = p->push("ument_begin|>{\"q\": 1}<|tool_call_end|><|tool_calls_section_end|>");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].id, "functions.f:0");
  EXPECT_EQ(c.calls[0].arguments, R"({"q": 1})");
  EXPECT_EQ(p->finish().content, "");
}

TEST(ToolParser, BodyParsers) {
  auto ok = parse_deepseek_v3_call("function" + kDsSep + "f\n```json\n{}\n```");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->name, "f");
  EXPECT_EQ(ok->arguments, "{}");
  EXPECT_FALSE(
      parse_deepseek_v3_call("function" + kDsSep + "f\n{}").ok());  // no fence, no V3.1 name
  EXPECT_FALSE(parse_deepseek_v3_call("no separator").ok());
  EXPECT_FALSE(parse_deepseek_v3_call("function" + kDsSep + "f\n```json\n[1]\n```").ok());
  EXPECT_FALSE(parse_qwen3_call("{\"name\": \"\"}").ok());
  EXPECT_FALSE(parse_qwen3_call("{\"name\": \"f\", \"arguments\": 3}").ok());
  EXPECT_FALSE(parse_qwen3_call("not json").ok());
  auto kimi = parse_kimi_k2_call("functions.get_weather:12" + kKimiArg + "{}");
  ASSERT_TRUE(kimi.ok());
  EXPECT_EQ(kimi->name, "get_weather");
  EXPECT_EQ(kimi->id, "functions.get_weather:12");
  EXPECT_TRUE(parse_kimi_k2_call("f:0" + kKimiArg + "{}").ok());  // no "functions." prefix
  EXPECT_FALSE(parse_kimi_k2_call("functions.f:x" + kKimiArg + "{}").ok());
  EXPECT_FALSE(parse_kimi_k2_call("functions.:0" + kKimiArg + "{}").ok());
  EXPECT_FALSE(parse_kimi_k2_call("functions.f:0" + kKimiArg + "\"s\"").ok());
  auto unknown = ToolParser::create("hermes", 0);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'hermes'"), std::string::npos);
}

}  // namespace
}  // namespace xds::output

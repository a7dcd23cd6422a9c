// The per-choice output state machine over the shipped model's tokenizer. References:
// Tokenizer::decode of the whole id sequence (or of its prefixes) and hand-written splits.
#include "output/output_processor.h"

#include <gtest/gtest.h>

#include "output_test_util.h"

namespace xds::output {
namespace {

using protocol::OutputOptions;
using protocol::TokenDelta;
using protocol::ToolCall;

const Tokenizer& kjv() {
  return test::tokenizer("kjv");
}

std::vector<int32_t> encode(const std::string& text) {
  auto ids = kjv().encode(text, /*add_special_tokens=*/false);
  EXPECT_TRUE(ids.ok());
  EXPECT_EQ(kjv().decode(*ids, true), text) << "the text must round-trip";
  return *ids;
}

OutputProcessor make(const OutputOptions& o, const Tokenizer* tok = &kjv()) {
  ChoiceSetup s;
  s.request_id = "cmpl-1";
  s.index = 0;
  s.options = o;
  s.tokenizer = tok;
  s.call_id_seed = 42;
  auto p = OutputProcessor::create(s);
  XDS_CHECK(p.ok(), "{}", p.status().to_string());
  return std::move(p).value();
}

// Everything the steps said, concatenated.
struct Collected {
  std::string text, reasoning, finish_reason;
  std::vector<int32_t> token_ids;
  std::vector<std::string> token_texts;
  std::vector<ToolCall> calls;
  int32_t completion_tokens = 0;
  bool cancel = false;
  int deltas = 0;
};

// Feeds `ids` in deltas of `step` tokens; the last carries `finish` (and `extra` ids appended).
Collected feed(OutputProcessor& p, const std::vector<int32_t>& ids, size_t step,
               const std::string& finish, bool with_logprobs = false) {
  Collected c;
  for (size_t i = 0; i < ids.size(); i += step) {
    TokenDelta d;
    d.request_id = "cmpl-1";
    d.prompt_tokens = 7;
    d.tokens.assign(ids.begin() + i, ids.begin() + std::min(ids.size(), i + step));
    if (with_logprobs) {
      for (const int32_t id : d.tokens) d.logprobs.push_back({id, -0.5f, {}});
    }
    if (i + step >= ids.size()) d.finish_reason = finish;
    OutputStep s = p.consume(d);
    if (!s.emit) continue;
    ++c.deltas;
    EXPECT_EQ(s.delta.request_id, "cmpl-1");
    EXPECT_EQ(s.delta.prompt_tokens, 7);
    c.text += s.delta.text;
    c.reasoning += s.delta.reasoning;
    c.token_ids.insert(c.token_ids.end(), s.delta.token_ids.begin(), s.delta.token_ids.end());
    c.token_texts.insert(c.token_texts.end(), s.delta.token_texts.begin(),
                         s.delta.token_texts.end());
    for (const ToolCall& t : s.delta.tool_calls) c.calls.push_back(t);
    c.completion_tokens = s.delta.completion_tokens;
    c.cancel = c.cancel || s.cancel_on_device;
    if (s.finished) {
      EXPECT_EQ(s.delta.finish_reason.empty(), false);
      c.finish_reason = s.delta.finish_reason;
    } else {
      EXPECT_EQ(s.delta.finish_reason, "");
    }
  }
  return c;
}

const std::string kVerse = "In the beginning God created the heaven and the earth.";

TEST(OutputProcessor, PlainTextMatchesWholeDecode) {
  const std::vector<int32_t> ids = encode(kVerse);
  for (const size_t step : {1u, 2u, 5u}) {
    OutputProcessor p = make({});
    const Collected c = feed(p, ids, step, "length");
    EXPECT_EQ(c.text, kjv().decode(ids, true));
    EXPECT_EQ(c.token_ids, ids);
    EXPECT_EQ(c.completion_tokens, static_cast<int32_t>(ids.size()));
    EXPECT_EQ(c.finish_reason, "length");
    EXPECT_FALSE(c.cancel);
    EXPECT_TRUE(c.token_texts.empty());
    EXPECT_TRUE(p.finished());
  }
}

TEST(OutputProcessor, StopStringCutsAndCancels) {
  const std::vector<int32_t> ids = encode(kVerse);
  // The token that completes "created": the shortest prefix whose text contains it.
  size_t k = 0;
  while (kjv().decode(std::span(ids).first(k), true).find("created") == std::string::npos) ++k;
  ASSERT_LT(k, ids.size());
  for (const size_t step : {1u, 3u, 100u}) {
    OutputOptions o;
    o.stop = {"created", "never matches"};
    OutputProcessor p = make(o);
    const Collected c = feed(p, ids, step, "length");
    EXPECT_EQ(c.text, kVerse.substr(0, kVerse.find("created")));
    EXPECT_EQ(c.finish_reason, "stop");
    // The device must be told only when the match came before its own last delta.
    EXPECT_EQ(c.cancel, (k - 1) / step != (ids.size() - 1) / step) << "step " << step;
    EXPECT_EQ(c.token_ids, std::vector<int32_t>(ids.begin(), ids.begin() + k));
    EXPECT_EQ(c.completion_tokens, static_cast<int32_t>(k));
    // Late deltas from the device are ignored.
    TokenDelta late;
    late.tokens = {ids[0]};
    EXPECT_FALSE(p.consume(late).emit);
  }
}

TEST(OutputProcessor, HeldBackTextIsReleasedAtTheEnd) {
  const std::string text = "and the earth was without form";
  const std::vector<int32_t> ids = encode(text);
  OutputOptions o;
  o.stop = {"form and void"};  // the output ends inside a partial match
  OutputProcessor p = make(o);
  const Collected c = feed(p, ids, 1, "length");
  EXPECT_EQ(c.text, text);
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_FALSE(c.cancel);
}

TEST(OutputProcessor, EosTokenHasNoText) {
  std::vector<int32_t> ids = encode(kVerse);
  const auto eos = kjv().eos_id();
  ASSERT_TRUE(eos.has_value());
  ids.push_back(*eos);
  OutputOptions o;
  o.skip_special_tokens = false;
  OutputProcessor p = make(o);
  const Collected c = feed(p, ids, 4, "stop");
  EXPECT_EQ(c.text, kVerse);
  EXPECT_EQ(c.token_ids, ids);
  EXPECT_EQ(c.completion_tokens, static_cast<int32_t>(ids.size()));
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_FALSE(c.cancel);  // the device finished it
}

TEST(OutputProcessor, LogprobTexts) {
  const std::vector<int32_t> ids = encode(kVerse);
  OutputProcessor p = make({});
  const Collected c = feed(p, ids, 3, "length", /*with_logprobs=*/true);
  ASSERT_EQ(c.token_texts.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(c.token_texts[i], kjv().decode(std::span(ids).subspan(i, 1), false));
  }
}

TEST(OutputProcessor, ReasoningAndToolCalls) {
  const std::string text =
      "<think>\nplan: call f\n</think>\n\nCalling.<tool_call>\n{\"name\": \"f\", \"arguments\": "
      "{\"a\": 1}}\n</tool_call>";
  std::vector<int32_t> ids = encode(text);
  ids.push_back(*kjv().eos_id());
  for (const size_t step : {1u, 4u}) {
    OutputOptions o;
    o.reasoning_parser = "qwen3";
    o.tool_call_parser = "qwen3";
    o.tools_requested = true;
    OutputProcessor p = make(o);
    const Collected c = feed(p, ids, step, "stop");
    EXPECT_EQ(c.reasoning, "\nplan: call f\n");
    EXPECT_EQ(c.text, "Calling.");
    ASSERT_EQ(c.calls.size(), 1u);
    EXPECT_EQ(c.calls[0].name, "f");
    EXPECT_EQ(c.calls[0].arguments, R"({"a":1})");
    EXPECT_EQ(c.finish_reason, "tool_calls");
  }
  // Without tools in the request the call text is plain content.
  OutputOptions o;
  o.reasoning_parser = "deepseek_r1";
  o.tool_call_parser = "qwen3";
  OutputProcessor p = make(o);
  const Collected c = feed(p, ids, 2, "stop");
  EXPECT_EQ(c.text, text.substr(text.find("Calling.")));
  EXPECT_TRUE(c.calls.empty());
  EXPECT_EQ(c.finish_reason, "stop");
}

TEST(OutputProcessor, PromptInsideReasoning) {
  const std::vector<int32_t> ids = encode("The sum is 4.</think>\n\n4");
  OutputOptions o;
  o.reasoning_parser = "deepseek_r1";
  o.prompt_in_reasoning = true;
  OutputProcessor p = make(o);
  const Collected c = feed(p, ids, 2, "length");
  EXPECT_EQ(c.reasoning, "The sum is 4.");
  EXPECT_EQ(c.text, "4");
}

TEST(OutputProcessor, TokenIdsOnlyWithoutTokenizer) {
  OutputOptions o;
  o.detokenize = false;
  o.stop = {"x"};
  OutputProcessor p = make(o, nullptr);
  const std::vector<int32_t> ids = {5, 900, 77, 3};
  const Collected c = feed(p, ids, 3, "length", /*with_logprobs=*/true);
  EXPECT_EQ(c.token_ids, ids);
  EXPECT_EQ(c.text, "");
  EXPECT_TRUE(c.token_texts.empty());
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.completion_tokens, 4);
}

TEST(OutputProcessor, SetupErrors) {
  ChoiceSetup s;
  s.request_id = "cmpl-9";
  auto no_tok = OutputProcessor::create(s);  // detokenize without a tokenizer
  ASSERT_FALSE(no_tok.ok());
  EXPECT_NE(no_tok.status().message().find("cmpl-9"), std::string::npos);
  s.tokenizer = &kjv();
  s.options.reasoning_parser = "nope";
  EXPECT_FALSE(OutputProcessor::create(s).ok());
  s.options.reasoning_parser = "";
  s.options.tool_call_parser = "nope";
  s.options.tools_requested = true;
  EXPECT_FALSE(OutputProcessor::create(s).ok());
}

}  // namespace
}  // namespace xds::output

// Response objects against hand-written JSON following the OpenAI API reference:
// chat.completion, text_completion, their logprobs formats, usage, tool calls, token ids, and
// the streamed chunk sequences (role first, finish chunk, usage chunk, [DONE]).
#include <gtest/gtest.h>

#include "serve/openai_api.h"

namespace xds::serve {
namespace {

using nlohmann::json;

ResponseMeta meta(std::string id = "chatcmpl-1") {
  ResponseMeta m;
  m.id = std::move(id);
  m.created = 100;
  m.model = "tiny";
  return m;
}

ApiRequest request(ApiKind kind, int32_t n = 1) {
  ApiRequest r;
  r.kind = kind;
  r.model = "tiny";
  r.n = n;
  return r;
}

engine::OutputDelta delta(int32_t index, std::string text, std::string finish = "") {
  engine::OutputDelta d;
  d.request_id = "r";
  d.index = index;
  d.text = std::move(text);
  d.finish_reason = std::move(finish);
  return d;
}

std::vector<json> parse_all(const std::vector<std::string>& payloads) {
  std::vector<json> out;
  for (const auto& p : payloads) out.push_back(p == "[DONE]" ? json("[DONE]") : json::parse(p));
  return out;
}

TEST(OpenAiResponse, ChatWhole) {
  ResponseAccumulator acc(1);
  auto d1 = delta(0, "Hel");
  d1.prompt_tokens = 5;
  d1.completion_tokens = 2;
  d1.cached_tokens = 4;
  auto d2 = delta(0, "lo", "stop");
  d2.prompt_tokens = 5;
  d2.completion_tokens = 3;
  d2.cached_tokens = 4;
  acc.add(d1);
  EXPECT_FALSE(acc.done());
  acc.add(d2);
  EXPECT_TRUE(acc.done());
  EXPECT_FALSE(acc.failed());
  json expected = R"({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 100, "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                 "logprobs": null, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
              "prompt_tokens_details": {"cached_tokens": 4}}
  })"_json;
  EXPECT_EQ(make_chat_response(request(ApiKind::kChat), meta(), acc), expected);
}

TEST(OpenAiResponse, ChatToolCallsAndReasoning) {
  ResponseAccumulator acc(1);
  auto d = delta(0, "", "stop");
  d.reasoning = "The user wants weather.";
  d.tool_calls.push_back({"call_0", "get_weather", "{\"city\": \"Oslo\"}"});
  d.prompt_tokens = 9;
  d.completion_tokens = 12;
  acc.add(d);
  json expected = R"({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 100, "model": "tiny",
    "choices": [{"index": 0,
                 "message": {"role": "assistant", "content": null,
                             "reasoning_content": "The user wants weather.",
                             "tool_calls": [{"id": "call_0", "type": "function",
                                             "function": {"name": "get_weather",
                                                          "arguments": "{\"city\": \"Oslo\"}"}}]},
                 "logprobs": null, "finish_reason": "tool_calls"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21,
              "prompt_tokens_details": {"cached_tokens": 0}}
  })"_json;
  EXPECT_EQ(make_chat_response(request(ApiKind::kChat), meta(), acc), expected);
}

TEST(OpenAiResponse, ChatLogprobs) {
  ResponseMeta m = meta();
  m.token_text = [](int32_t id) { return id == 10 ? std::string("\xC3\xA9") : std::string("e"); };
  std::vector<engine::TokenLogprob> lps = {{10, -0.5f, {{10, -0.5f}, {11, -1.25f}}}};
  json expected = R"({"content": [
      {"token": "é", "logprob": -0.5, "bytes": [195, 169],
       "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [195, 169]},
                        {"token": "e", "logprob": -1.25, "bytes": [101]}]}],
    "refusal": null})"_json;
  EXPECT_EQ(make_chat_logprobs(lps, {"\xC3\xA9"}, m), expected);
  // Without texts: token_id:<id>.
  json ids = make_chat_logprobs({{7, -1.0f, {}}}, {}, meta());
  EXPECT_EQ(ids["content"][0]["token"], "token_id:7");
  EXPECT_EQ(ids["content"][0]["top_logprobs"], json::array());
}

TEST(OpenAiResponse, CompletionWholeWithLogprobsAndTwoChoices) {
  ResponseMeta m = meta("cmpl-9");
  m.token_text = [](int32_t id) { return std::string(id == 1 ? "H\xC3\xA9" : id == 2 ? "llo" : "x"); };
  ApiRequest r = request(ApiKind::kCompletion, 2);
  r.logprobs = 1;
  ResponseAccumulator acc(2);
  auto a = delta(0, "H\xC3\xA9llo", "length");
  a.token_ids = {1, 2};
  a.token_texts = {"H\xC3\xA9", "llo"};
  a.logprobs = {{1, -0.25f, {{1, -0.25f}}}, {2, -2.0f, {{3, -1.0f}}}};
  a.prompt_tokens = 3;
  a.completion_tokens = 2;
  auto b = delta(1, "x", "stop");
  b.token_ids = {3};
  b.token_texts = {"x"};
  b.logprobs = {{3, -0.125f, {{3, -0.125f}}}};
  b.prompt_tokens = 3;
  b.completion_tokens = 1;
  acc.add(b);  // choices may arrive in any order
  EXPECT_FALSE(acc.done());
  acc.add(a);
  ASSERT_TRUE(acc.done());
  json expected = R"({
    "id": "cmpl-9", "object": "text_completion", "created": 100, "model": "tiny",
    "choices": [
      {"index": 0, "text": "Héllo", "finish_reason": "length",
       "logprobs": {"tokens": ["Hé", "llo"], "token_logprobs": [-0.25, -2.0],
                    "top_logprobs": [{"Hé": -0.25}, {"x": -1.0}], "text_offset": [0, 2]}},
      {"index": 1, "text": "x", "finish_reason": "stop",
       "logprobs": {"tokens": ["x"], "token_logprobs": [-0.125],
                    "top_logprobs": [{"x": -0.125}], "text_offset": [0]}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
              "prompt_tokens_details": {"cached_tokens": 0}}
  })"_json;
  EXPECT_EQ(make_completion_response(r, m, acc), expected);
}

TEST(OpenAiResponse, CompletionTokenIdsForATokenizerLessModel) {
  ResponseMeta m = meta("cmpl-2");
  m.include_token_ids = true;
  ResponseAccumulator acc(1);
  auto d = delta(0, "", "length");
  d.token_ids = {5, 6, 7};
  d.prompt_tokens = 2;
  d.completion_tokens = 3;
  acc.add(d);
  json expected = R"({
    "id": "cmpl-2", "object": "text_completion", "created": 100, "model": "tiny",
    "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": "length",
                 "token_ids": [5, 6, 7]}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5,
              "prompt_tokens_details": {"cached_tokens": 0}}
  })"_json;
  EXPECT_EQ(make_completion_response(request(ApiKind::kCompletion), m, acc), expected);
}

TEST(OpenAiResponse, AccumulatorFailures) {
  ResponseAccumulator acc(1);
  acc.add(delta(3, "x"));
  EXPECT_TRUE(acc.failed());
  EXPECT_TRUE(acc.done());
  ResponseAccumulator acc2(2);
  engine::OutputDelta e = delta(0, "");
  e.error = "device lost";
  acc2.add(e);
  EXPECT_TRUE(acc2.done());
  EXPECT_EQ(acc2.error(), "device lost");
}

TEST(OpenAiResponse, ChatStreamWithUsage) {
  ApiRequest r = request(ApiKind::kChat);
  r.stream = true;
  r.include_usage = true;
  ChunkStreamer s(r, meta());
  auto d1 = delta(0, "Hi");
  d1.prompt_tokens = 4;
  d1.completion_tokens = 1;
  auto d2 = delta(0, "!", "stop");
  d2.prompt_tokens = 4;
  d2.completion_tokens = 2;
  d2.cached_tokens = 2;
  std::vector<std::string> payloads;
  for (const auto& d : {d1, delta(0, ""), d2}) {  // the empty delta yields nothing
    auto p = s.on_delta(d);
    payloads.insert(payloads.end(), p.begin(), p.end());
  }
  EXPECT_TRUE(s.done());
  auto tail = s.finish();
  payloads.insert(payloads.end(), tail.begin(), tail.end());
  const char* head = R"("id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 100,
                        "model": "tiny")";
  std::vector<json> expected = {
      json::parse(std::string("{") + head + R"(, "usage": null, "choices": [{"index": 0,
          "delta": {"role": "assistant", "content": "Hi"}, "logprobs": null,
          "finish_reason": null}]})"),
      json::parse(std::string("{") + head + R"(, "usage": null, "choices": [{"index": 0,
          "delta": {"content": "!"}, "logprobs": null, "finish_reason": null}]})"),
      json::parse(std::string("{") + head + R"(, "usage": null, "choices": [{"index": 0,
          "delta": {}, "logprobs": null, "finish_reason": "stop"}]})"),
      json::parse(std::string("{") + head + R"(, "choices": [],
          "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                    "prompt_tokens_details": {"cached_tokens": 2}}})"),
      json("[DONE]")};
  EXPECT_EQ(parse_all(payloads), expected);
}

TEST(OpenAiResponse, ChatStreamToolCallsAndTwoChoices) {
  ApiRequest r = request(ApiKind::kChat, 2);
  r.stream = true;
  ChunkStreamer s(r, meta());
  auto t = delta(1, "");
  t.tool_calls.push_back({"call_a", "f", "{}"});
  t.tool_calls.push_back({"call_b", "g", "{\"x\":1}"});
  auto p1 = parse_all(s.on_delta(t));
  json expected_calls = R"([
    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    {"index": 1, "id": "call_b", "type": "function",
     "function": {"name": "g", "arguments": "{\"x\":1}"}}])"_json;
  ASSERT_EQ(p1.size(), 1u);
  EXPECT_EQ(p1[0]["choices"][0]["index"], 1);
  EXPECT_EQ(p1[0]["choices"][0]["delta"]["tool_calls"], expected_calls);
  EXPECT_FALSE(p1[0].contains("usage"));
  auto p2 = parse_all(s.on_delta(delta(1, "", "stop")));
  ASSERT_EQ(p2.size(), 1u);
  EXPECT_EQ(p2[0]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_FALSE(s.done());  // choice 0 still running
  // A choice that finishes with no text still gets its role.
  auto p3 = parse_all(s.on_delta(delta(0, "", "length")));
  ASSERT_EQ(p3.size(), 2u);
  EXPECT_EQ(p3[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(p3[1]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.finish(), std::vector<std::string>{"[DONE]"});
}

TEST(OpenAiResponse, CompletionStreamWithLogprobsOffsets) {
  ApiRequest r = request(ApiKind::kCompletion);
  r.stream = true;
  r.logprobs = 0;
  ChunkStreamer s(r, meta("cmpl-3"));
  auto d1 = delta(0, "H\xC3\xA9");
  d1.token_ids = {1};
  d1.token_texts = {"H\xC3\xA9"};
  d1.logprobs = {{1, -0.5f, {}}};
  auto d2 = delta(0, "y", "length");
  d2.token_ids = {2};
  d2.token_texts = {"y"};
  d2.logprobs = {{2, -1.5f, {}}};
  auto p = parse_all(s.on_delta(d1));
  auto q = parse_all(s.on_delta(d2));
  ASSERT_EQ(p.size(), 1u);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(p[0], R"({"id": "cmpl-3", "object": "text_completion", "created": 100, "model": "tiny",
      "choices": [{"index": 0, "text": "Hé", "finish_reason": null,
                   "logprobs": {"tokens": ["Hé"], "token_logprobs": [-0.5],
                                "top_logprobs": [{}], "text_offset": [0]}}]})"_json);
  EXPECT_EQ(q[0]["choices"][0], R"({"index": 0, "text": "y", "finish_reason": "length",
      "logprobs": {"tokens": ["y"], "token_logprobs": [-1.5], "top_logprobs": [{}],
                   "text_offset": [2]}})"_json);
  EXPECT_TRUE(s.done());
}

TEST(OpenAiResponse, StreamErrorAndInvalidUtf8) {
  ChunkStreamer s(request(ApiKind::kChat), meta());
  engine::OutputDelta e = delta(0, "");
  e.error = "KV exhausted";
  auto p = parse_all(s.on_delta(e));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0]["error"]["message"], "KV exhausted");
  EXPECT_EQ(p[0]["error"]["type"], "server_error");
  EXPECT_TRUE(s.done());
  EXPECT_TRUE(s.on_delta(delta(0, "late")).empty());

  // A token that splits a UTF-8 character is serialized with U+FFFD, not a throw.
  ChunkStreamer t(request(ApiKind::kChat), meta());
  auto chunks = t.on_delta(delta(0, "\xE4\xBD"));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(json::parse(chunks[0])["choices"][0]["delta"]["content"], "\xEF\xBF\xBD");
}

TEST(OpenAiResponse, Models) {
  EXPECT_EQ(make_models_response({"tiny"}, 5, 4096), R"({"object": "list", "data": [
      {"id": "tiny", "object": "model", "created": 5, "owned_by": "xdeepserve",
       "max_model_len": 4096}]})"_json);
}

}  // namespace
}  // namespace xds::serve

// Request validation against the OpenAI API reference: accepted shapes, the 400/404 answers
// (status, type, code, param), fields the engine cannot honour, and the engine options.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "serve/openai_api.h"

namespace xds::serve {
namespace {

using nlohmann::json;

ApiLimits limits() {
  ApiLimits l;
  l.model_names = {"tiny"};
  l.vocab_size = 1000;
  return l;
}

json chat(json extra = json::object()) {
  json body = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  body.update(extra);
  return body;
}

json completion(json extra = json::object()) {
  json body = {{"model", "tiny"}, {"prompt", "Once upon"}};
  body.update(extra);
  return body;
}

// The error a chat body gets: {status, code, param}.
struct Expect {
  int status;
  std::string code;
  std::string param;
};

void expect_chat_error(const json& body, const Expect& e, const ApiLimits& l = limits()) {
  auto r = parse_chat_request(body, l);
  ASSERT_FALSE(r.ok()) << body.dump();
  EXPECT_EQ(r.error().http_status, e.status) << body.dump();
  EXPECT_EQ(r.error().code, e.code) << r.error().message;
  EXPECT_EQ(r.error().param, e.param) << r.error().message;
  EXPECT_FALSE(r.error().message.empty());
}

void expect_completion_error(const json& body, const Expect& e,
                             const ApiLimits& l = limits()) {
  auto r = parse_completion_request(body, l);
  ASSERT_FALSE(r.ok()) << body.dump();
  EXPECT_EQ(r.error().http_status, e.status) << body.dump();
  EXPECT_EQ(r.error().code, e.code) << r.error().message;
  EXPECT_EQ(r.error().param, e.param) << r.error().message;
}

TEST(OpenAiRequest, ChatFullRequest) {
  json body = R"({
    "model": "tiny",
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
       "name": "ann"},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
      {"role": "tool", "content": "12C", "tool_call_id": "call_1"}
    ],
    "max_completion_tokens": 64, "max_tokens": 10, "temperature": 0.5, "top_p": 0.9, "top_k": -1,
    "seed": 7, "stop": "END", "n": 2, "ignore_eos": true, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "repetition_penalty": 1.1, "logprobs": true, "top_logprobs": 3,
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w",
               "parameters": {"type": "object"}}}],
    "tool_choice": "auto", "stream": true, "stream_options": {"include_usage": true},
    "user": "u-1", "some_future_field": {"x": 1}, "logit_bias": {}, "response_format": {"type": "text"}
  })"_json;
  auto r = parse_chat_request(body, limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ApiRequest& q = r.value();
  EXPECT_EQ(q.kind, ApiKind::kChat);
  EXPECT_EQ(q.model, "tiny");
  ASSERT_EQ(q.messages.size(), 4u);
  EXPECT_EQ(q.messages[0].role, "system");
  EXPECT_EQ(q.messages[0].content, "be brief");
  EXPECT_EQ(q.messages[1].content, "a\nb");
  EXPECT_EQ(q.messages[1].name, "ann");
  EXPECT_FALSE(q.messages[2].content.has_value());
  EXPECT_EQ(q.messages[2].reasoning_content, "hmm");
  ASSERT_EQ(q.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(q.messages[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(q.messages[2].tool_calls[0].name, "get_weather");
  EXPECT_EQ(q.messages[2].tool_calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(q.messages[3].tool_call_id, "call_1");
  EXPECT_EQ(q.max_tokens, 64);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(*q.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*q.top_p, 0.9f);
  EXPECT_EQ(q.top_k, 0);
  EXPECT_EQ(q.seed, 7);
  EXPECT_EQ(q.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(q.n, 2);
  EXPECT_TRUE(q.ignore_eos);
  EXPECT_FLOAT_EQ(q.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(q.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(q.repetition_penalty, 1.1f);
  EXPECT_EQ(q.logprobs, 3);
  ASSERT_EQ(q.tools.size(), 1u);
  EXPECT_EQ(q.tools[0].name, "get_weather");
  EXPECT_EQ(q.tools[0].parameters, nlohmann::ordered_json({{"type", "object"}}));
  EXPECT_EQ(q.tools_json.size(), 1u);
  EXPECT_EQ(q.tool_choice, "auto");
  EXPECT_TRUE(q.stream);
  EXPECT_TRUE(q.include_usage);
}

TEST(OpenAiRequest, TemplateMessagesAndToolKeyOrder) {
  // The body as a client sends it; keys deliberately not in sorted order.
  auto body = parse_json_body(R"({"model": "tiny", "messages": [
      {"role": "system", "content": "s"},
      {"role": "assistant", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
      {"role": "tool", "content": "ok", "tool_call_id": "c1"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}}]})");
  ASSERT_TRUE(body.ok());
  auto r = parse_chat_request(body.value(), limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  // tojson of the tools keeps the client's order (as Python's json.loads would).
  EXPECT_EQ(r.value().tools_json.dump(),
            R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
            R"("properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}}}}])");
  EXPECT_EQ(make_template_messages(r.value()).dump(),
            R"([{"role":"system","content":"s"},)"
            R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",)"
            R"("function":{"name":"f","arguments":"{\"a\":1}"}}]},)"
            R"({"role":"tool","content":"ok","tool_call_id":"c1"}])");
}

TEST(OpenAiRequest, ChatDefaultsAndMissingModel) {
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto r = parse_chat_request(body, limits());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().model, "tiny");
  EXPECT_FALSE(r.value().max_tokens.has_value());
  EXPECT_FALSE(r.value().temperature.has_value());
  EXPECT_FALSE(r.value().seed.has_value());
  EXPECT_EQ(r.value().n, 1);
  EXPECT_EQ(r.value().logprobs, -1);
  EXPECT_FALSE(r.value().stream);
  // logprobs true without top_logprobs: the chosen token only.
  auto lp = parse_chat_request(chat({{"logprobs", true}}), limits());
  ASSERT_TRUE(lp.ok());
  EXPECT_EQ(lp.value().logprobs, 0);
  // null means absent.
  auto nul = parse_chat_request(chat({{"temperature", nullptr}, {"stop", nullptr}}), limits());
  ASSERT_TRUE(nul.ok());
  EXPECT_FALSE(nul.value().temperature.has_value());
  // A list of stop strings.
  auto st = parse_chat_request(chat({{"stop", {"a", "b"}}}), limits());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st.value().stop, (std::vector<std::string>{"a", "b"}));
}

TEST(OpenAiRequest, ChatInvalidValues) {
  expect_chat_error(chat({{"temperature", 2.5}}), {400, "invalid_value", "temperature"});
  expect_chat_error(chat({{"temperature", "hot"}}), {400, "invalid_type", "temperature"});
  expect_chat_error(chat({{"top_p", 0}}), {400, "invalid_value", "top_p"});
  expect_chat_error(chat({{"top_p", 1.5}}), {400, "invalid_value", "top_p"});
  expect_chat_error(chat({{"top_k", -2}}), {400, "invalid_value", "top_k"});
  expect_chat_error(chat({{"n", 0}}), {400, "invalid_value", "n"});
  expect_chat_error(chat({{"n", 17}}), {400, "invalid_value", "n"});
  expect_chat_error(chat({{"n", 1.5}}), {400, "invalid_type", "n"});
  expect_chat_error(chat({{"max_tokens", 0}}), {400, "invalid_value", "max_tokens"});
  expect_chat_error(chat({{"max_completion_tokens", -1}}),
                    {400, "invalid_value", "max_completion_tokens"});
  expect_chat_error(chat({{"presence_penalty", 2.1}}), {400, "invalid_value", "presence_penalty"});
  expect_chat_error(chat({{"frequency_penalty", -3}}), {400, "invalid_value", "frequency_penalty"});
  expect_chat_error(chat({{"repetition_penalty", 0}}), {400, "invalid_value", "repetition_penalty"});
  expect_chat_error(chat({{"seed", "x"}}), {400, "invalid_type", "seed"});
  expect_chat_error(chat({{"stop", 5}}), {400, "invalid_type", "stop"});
  expect_chat_error(chat({{"stop", {"a", ""}}}), {400, "invalid_value", "stop"});
  json many = json::array();
  for (int i = 0; i < 17; ++i) many.push_back(fmt::format("s{}", i));
  expect_chat_error(chat({{"stop", many}}), {400, "invalid_value", "stop"});
  expect_chat_error(chat({{"stop_token_ids", {1, 5000}}}), {400, "invalid_value", "stop_token_ids"});
  expect_chat_error(chat({{"stream", "yes"}}), {400, "invalid_type", "stream"});
  expect_chat_error(chat({{"stream_options", {{"include_usage", true}}}}),
                    {400, "invalid_value", "stream_options"});
  expect_chat_error(chat({{"logprobs", 1}}), {400, "invalid_type", "logprobs"});
  expect_chat_error(chat({{"top_logprobs", 2}}), {400, "invalid_value", "top_logprobs"});
  expect_chat_error(chat({{"logprobs", true}, {"top_logprobs", 21}}),
                    {400, "invalid_value", "top_logprobs"});
  expect_chat_error(chat({{"ignore_eos", 1}}), {400, "invalid_type", "ignore_eos"});
}

TEST(OpenAiRequest, ChatMessagesValidation) {
  expect_chat_error({{"model", "tiny"}}, {400, "missing_required_parameter", "messages"});
  expect_chat_error({{"model", "tiny"}, {"messages", "hi"}}, {400, "invalid_type", "messages"});
  expect_chat_error({{"model", "tiny"}, {"messages", json::array()}},
                    {400, "invalid_value", "messages"});
  expect_chat_error({{"model", "tiny"}, {"messages", {{{"content", "x"}}}}},
                    {400, "missing_required_parameter", "messages[0].role"});
  expect_chat_error({{"model", "tiny"}, {"messages", {{{"role", "wizard"}, {"content", "x"}}}}},
                    {400, "invalid_value", "messages[0].role"});
  expect_chat_error({{"model", "tiny"}, {"messages", {{{"role", "user"}}}}},
                    {400, "missing_required_parameter", "messages[0].content"});
  expect_chat_error(
      {{"model", "tiny"},
       {"messages",
        {{{"role", "user"}, {"content", "a"}},
         {{"role", "user"},
          {"content", {{{"type", "image_url"}, {"image_url", {{"url", "http://x"}}}}}}}}}},
      {400, "unsupported_parameter", "messages[1].content[0].type"});
  expect_chat_error(
      {{"model", "tiny"}, {"messages", {{{"role", "tool"}, {"content", "12C"}}}}},
      {400, "missing_required_parameter", "messages[0].tool_call_id"});
  expect_chat_error({{"model", "tiny"},
                     {"messages", {{{"role", "assistant"}, {"tool_calls", {{{"id", "c"}}}}}}}},
                    {400, "missing_required_parameter", "messages[0].tool_calls[0].function"});
}

TEST(OpenAiRequest, ChatRefusesWhatTheEngineCannotHonour) {
  expect_chat_error(chat({{"logit_bias", {{"50256", -100}}}}),
                    {400, "unsupported_parameter", "logit_bias"});
  expect_chat_error(chat({{"response_format", {{"type", "json_object"}}}}),
                    {400, "unsupported_parameter", "response_format"});
  expect_chat_error(chat({{"tool_choice", "required"}}), {400, "unsupported_parameter", "tool_choice"});
  expect_chat_error(chat({{"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}),
                    {400, "unsupported_parameter", "tool_choice"});
  expect_chat_error(chat({{"tool_choice", "sometimes"}}), {400, "invalid_value", "tool_choice"});
  expect_chat_error(chat({{"tools", {{{"type", "retrieval"}}}}}),
                    {400, "unsupported_parameter", "tools[0].type"});
  expect_chat_error(chat({{"functions", {{{"name", "f"}}}}}), {400, "unsupported_parameter", "functions"});
  expect_chat_error(chat({{"audio", {{"voice", "alloy"}}}}), {400, "unsupported_parameter", "audio"});
  expect_chat_error(chat({{"modalities", {"text", "audio"}}}),
                    {400, "unsupported_parameter", "modalities"});
  // Accepted no-ops.
  EXPECT_TRUE(parse_chat_request(chat({{"tool_choice", "none"}, {"modalities", {"text"}},
                                       {"parallel_tool_calls", false}, {"store", false}}),
                                 limits())
                  .ok());
}

TEST(OpenAiRequest, UnknownModelIs404) {
  expect_chat_error(chat({{"model", "gpt-4o"}}), {404, "model_not_found", "model"});
  expect_completion_error(completion({{"model", "gpt-4o"}}), {404, "model_not_found", "model"});
  ApiLimits any = limits();
  any.model_names.clear();
  EXPECT_TRUE(parse_chat_request(chat({{"model", "whatever"}}), any).ok());
}

TEST(OpenAiRequest, ChatWithoutTokenizerIsRefused) {
  ApiLimits l = limits();
  l.has_tokenizer = false;
  expect_chat_error(chat(), {400, "invalid_value", "messages"}, l);
}

TEST(OpenAiRequest, CompletionPrompts) {
  auto text = parse_completion_request(completion(), limits());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text.value().kind, ApiKind::kCompletion);
  EXPECT_EQ(text.value().prompt_text, "Once upon");
  EXPECT_TRUE(text.value().prompt_ids.empty());

  auto ids = parse_completion_request(completion({{"prompt", {1, 2, 999}}}), limits());
  ASSERT_TRUE(ids.ok());
  EXPECT_FALSE(ids.value().prompt_text.has_value());
  EXPECT_EQ(ids.value().prompt_ids, (std::vector<int32_t>{1, 2, 999}));

  auto one_text = parse_completion_request(completion({{"prompt", {"hello"}}}), limits());
  ASSERT_TRUE(one_text.ok());
  EXPECT_EQ(one_text.value().prompt_text, "hello");

  auto one_ids = parse_completion_request(completion({{"prompt", {{4, 5}}}}), limits());
  ASSERT_TRUE(one_ids.ok());
  EXPECT_EQ(one_ids.value().prompt_ids, (std::vector<int32_t>{4, 5}));

  expect_completion_error({{"model", "tiny"}}, {400, "missing_required_parameter", "prompt"});
  expect_completion_error(completion({{"prompt", {"a", "b"}}}),
                          {400, "unsupported_parameter", "prompt"});
  expect_completion_error(completion({{"prompt", {1, 1000}}}), {400, "invalid_value", "prompt"});
  expect_completion_error(completion({{"prompt", {1, -1}}}), {400, "invalid_value", "prompt"});
  expect_completion_error(completion({{"prompt", json::array()}}), {400, "invalid_value", "prompt"});
  expect_completion_error(completion({{"prompt", ""}}), {400, "invalid_value", "prompt"});
  expect_completion_error(completion({{"prompt", 5}}), {400, "invalid_type", "prompt"});
  expect_completion_error(completion({{"prompt", {{1}, "x"}}}),
                          {400, "unsupported_parameter", "prompt"});
}

TEST(OpenAiRequest, CompletionWithoutTokenizerTakesIdsOnly) {
  ApiLimits l = limits();
  l.has_tokenizer = false;
  expect_completion_error(completion(), {400, "invalid_value", "prompt"}, l);
  auto ids = parse_completion_request(completion({{"prompt", {3, 4}}}), l);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids.value().prompt_ids, (std::vector<int32_t>{3, 4}));
}

TEST(OpenAiRequest, CompletionFields) {
  auto r = parse_completion_request(
      completion({{"logprobs", 5}, {"best_of", 2}, {"n", 2}, {"echo", false}, {"suffix", ""}}),
      limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().logprobs, 5);
  EXPECT_EQ(r.value().n, 2);
  expect_completion_error(completion({{"logprobs", true}}), {400, "invalid_type", "logprobs"});
  expect_completion_error(completion({{"logprobs", 21}}), {400, "invalid_value", "logprobs"});
  expect_completion_error(completion({{"best_of", 3}, {"n", 2}}),
                          {400, "unsupported_parameter", "best_of"});
  expect_completion_error(completion({{"best_of", 1}, {"n", 2}}), {400, "invalid_value", "best_of"});
  expect_completion_error(completion({{"echo", true}}), {400, "unsupported_parameter", "echo"});
  expect_completion_error(completion({{"suffix", "}"}}), {400, "unsupported_parameter", "suffix"});
}

TEST(OpenAiRequest, JsonBody) {
  EXPECT_TRUE(parse_json_body("{\"a\": 1}").ok());
  auto bad = parse_json_body("{\"a\": ");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().http_status, 400);
  EXPECT_EQ(bad.error().type, "invalid_request_error");
  EXPECT_FALSE(parse_json_body("[1, 2]").ok());
  EXPECT_FALSE(parse_json_body("").ok());
}

TEST(OpenAiRequest, ErrorObjects) {
  // The shape of the OpenAI reference: {"error": {"message", "type", "param", "code"}}.
  ApiError e = invalid_value("temperature", "must be between 0 and 2, got 3.");
  EXPECT_EQ(make_error(e), json::parse(R"({"error": {
      "message": "Invalid value for 'temperature': must be between 0 and 2, got 3.",
      "type": "invalid_request_error", "param": "temperature", "code": "invalid_value"}})"));
  EXPECT_EQ(make_error(malformed_json("x"))["error"]["param"], nullptr);
  EXPECT_EQ(make_error(malformed_json("x"))["error"]["code"], nullptr);

  HttpResponse unauthorized = make_error_response(invalid_api_key());
  EXPECT_EQ(unauthorized.status, 401);
  EXPECT_EQ(json::parse(unauthorized.body)["error"]["type"], "authentication_error");
  EXPECT_EQ(json::parse(unauthorized.body)["error"]["code"], "invalid_api_key");

  HttpResponse busy = make_error_response(queue_full(2));
  EXPECT_EQ(busy.status, 503);
  ASSERT_EQ(busy.headers.size(), 1u);
  EXPECT_EQ(busy.headers[0], (std::pair<std::string, std::string>{"Retry-After", "2"}));

  ApiError ctx = context_length_exceeded("messages", 4000, 200, 4096);
  EXPECT_EQ(ctx.http_status, 400);
  EXPECT_EQ(ctx.code, "context_length_exceeded");
  EXPECT_EQ(ctx.message,
            "This model's maximum context length is 4096 tokens. However, you requested 4200 "
            "tokens (4000 in the messages, 200 in the completion). Please reduce the length of "
            "the messages or completion.");

  EXPECT_EQ(api_error_from_status(invalid_argument("bad")).http_status, 400);
  EXPECT_EQ(api_error_from_status(resource_exhausted("full")).http_status, 503);
  EXPECT_EQ(api_error_from_status(internal_error("bug")).http_status, 500);
}

TEST(OpenAiRequest, ApiKey) {
  EXPECT_TRUE(check_api_key("", ""));
  EXPECT_TRUE(check_api_key("Bearer sk-1", ""));
  EXPECT_TRUE(check_api_key("Bearer sk-1", "sk-1"));
  EXPECT_TRUE(check_api_key("bearer sk-1", "sk-1"));
  EXPECT_FALSE(check_api_key("", "sk-1"));
  EXPECT_FALSE(check_api_key("Bearer sk-2", "sk-1"));
  EXPECT_FALSE(check_api_key("Bearer sk-10", "sk-1"));
  EXPECT_FALSE(check_api_key("Bearer sk-", "sk-1"));
  EXPECT_FALSE(check_api_key("sk-1", "sk-1"));
  EXPECT_FALSE(check_api_key("Basic sk-1", "sk-1"));
}

TEST(OpenAiRequest, MaxTokensAgainstTheContext) {
  ApiRequest r;
  r.kind = ApiKind::kCompletion;
  auto fill = resolve_max_tokens(r, 100, 4096);
  ASSERT_TRUE(fill.ok());
  EXPECT_EQ(fill.value(), 3996);
  r.max_tokens = 3996;
  EXPECT_TRUE(resolve_max_tokens(r, 100, 4096).ok());
  r.max_tokens = 3997;
  auto over = resolve_max_tokens(r, 100, 4096);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().param, "prompt");
  EXPECT_EQ(over.error().code, "context_length_exceeded");
  r.max_tokens.reset();
  EXPECT_FALSE(resolve_max_tokens(r, 4096, 4096).ok());
  r.kind = ApiKind::kChat;
  EXPECT_EQ(resolve_max_tokens(r, 5000, 4096).error().param, "messages");
}

TEST(OpenAiRequest, EngineOptions) {
  auto r = parse_chat_request(
      chat({{"temperature", 0}, {"seed", -1}, {"stop", "X"}, {"stop_token_ids", {7}},
            {"logprobs", true}, {"top_logprobs", 2}, {"n", 3}, {"ignore_eos", true},
            {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}),
      limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  engine::SamplingOptions s =
      make_sampling_options(r.value(), 50, 1234, SamplingDefaults{0.6f, 0.95f, 20});
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_p, 0.95f);  // from the defaults
  EXPECT_EQ(s.top_k, 20);
  EXPECT_EQ(s.seed, ~uint64_t{0});  // -1 as unsigned
  EXPECT_EQ(s.max_tokens, 50);
  EXPECT_EQ(s.logprobs, 2);
  EXPECT_EQ(s.n, 3);
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.stop_token_ids, std::vector<int32_t>{7});

  auto unseeded = parse_chat_request(chat(), limits());
  EXPECT_EQ(make_sampling_options(unseeded.value(), 5, 1234, {}).seed, 1234u);

  engine::OutputOptions o = make_output_options(r.value(), {true, "deepseek_r1", "qwen3"});
  EXPECT_TRUE(o.detokenize);
  EXPECT_EQ(o.stop, std::vector<std::string>{"X"});
  EXPECT_EQ(o.reasoning_parser, "deepseek_r1");
  EXPECT_EQ(o.tool_call_parser, "qwen3");
  EXPECT_TRUE(o.tools_requested);
  EXPECT_FALSE(o.stream);
  EXPECT_FALSE(make_output_options(unseeded.value(), {}).tools_requested);
}

}  // namespace
}  // namespace xds::serve

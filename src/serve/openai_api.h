// The OpenAI API layer: request bodies -> ApiRequest (validated), engine output -> response
// JSON (whole and streamed), and OpenAI-style errors. Pure functions and plain values: no I/O,
// no clock (the caller passes ids and times in ResponseMeta).
//
//   POST /v1/chat/completions: parse_chat_request      -> make_chat_response / ChunkStreamer
//   POST /v1/completions:      parse_completion_request -> make_completion_response / ChunkStreamer
//
// Thread-safety: plain values and pure functions; a ChunkStreamer / ResponseAccumulator is
// used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/status.h"
#include "protocol/payloads.h"
#include "serve/http_server.h"

namespace xds::serve {

// ---- errors -----------------------------------------------------------------------------

// An OpenAI error object with its HTTP status:
//   {"error": {"message": ..., "type": ..., "code": ..., "param": ...}}
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";  // authentication_error, server_error, ...
  std::string code;   // "" -> null: invalid_value, invalid_type, missing_required_parameter,
                      // unsupported_parameter, model_not_found, invalid_api_key,
                      // context_length_exceeded, queue_full, ...
  std::string param;  // "" -> null: "temperature", "messages[1].content", ...
  std::string message;
  int retry_after_s = 0;  // > 0: a Retry-After header (503)
};

ApiError invalid_value(std::string param, std::string message);  // 400 invalid_value
ApiError invalid_type(std::string param, std::string expected);  // 400 invalid_type
ApiError unsupported(std::string param, std::string message);    // 400 unsupported_parameter
ApiError missing_parameter(std::string param);                   // 400 missing_required_..
ApiError malformed_json(std::string detail);                     // 400, param null
ApiError model_not_found(std::string_view model);                // 404 model_not_found
ApiError invalid_api_key();                                      // 401 authentication_error
ApiError queue_full(int retry_after_s);                          // 503 + Retry-After
ApiError context_length_exceeded(std::string param, int64_t prompt_tokens,
                                 int64_t max_tokens, int64_t max_model_len);  // 400
ApiError server_error(std::string message);                                   // 500
// A Status from elsewhere (engine, tokenizer) as an API error: InvalidArgument -> 400,
// NotFound -> 404, ResourceExhausted -> 503, Unavailable -> 503, the rest -> 500.
ApiError api_error_from_status(const Status& status);

nlohmann::json make_error(const ApiError& e);
HttpResponse make_error_response(const ApiError& e);  // with Retry-After when set

// A value or an ApiError (the answer for the client).
template <typename T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}       // NOLINT(google-explicit-constructor)
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return v_.index() == 0; }
  T& value() {
    XDS_CHECK(ok(), "ApiResult::value() on error: {}", std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  const T& value() const {
    XDS_CHECK(ok(), "ApiResult::value() on error: {}", std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  const ApiError& error() const {
    XDS_CHECK(!ok(), "ApiResult::error() on a value");
    return std::get<1>(v_);
  }

 private:
  std::variant<T, ApiError> v_;
};

// The body as a JSON object (400 naming the problem otherwise). Ordered: the keys keep the
// client's order, so a chat template's `tools | tojson` prints them as Python would.
ApiResult<nlohmann::ordered_json> parse_json_body(std::string_view body);

// `Authorization: Bearer <key>` against the configured key (empty key: always true).
// Constant-time in the key's length.
bool check_api_key(std::string_view authorization_header, std::string_view api_key);

// ---- requests ---------------------------------------------------------------------------

enum class ApiKind { kChat, kCompletion };

struct ChatMessage {
  std::string role;     // system | user | assistant | tool ("developer" becomes system)
  std::optional<std::string> content;  // text parts joined with "\n"; nullopt: null/absent
  std::string name;                    // optional participant name
  std::string reasoning_content;       // assistant, optional (multi-turn reasoning models)
  std::vector<engine::ToolCall> tool_calls;  // assistant
  std::string tool_call_id;                  // tool
};

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // JSON schema
};

// What the gateway keeps of a request after validation. Optional fields are nullopt when the
// client sent nothing (or null), so the caller can apply the model's defaults
// (generation_config.json).
struct ApiRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;

  // chat
  std::vector<ChatMessage> messages;
  std::vector<ToolSpec> tools;
  nlohmann::ordered_json tools_json = nlohmann::ordered_json::array();  // as sent (template)
  std::string tool_choice = "auto";  // "none" | "auto" (forced choices are refused)
  bool add_generation_prompt = true;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();

  // completions: exactly one of the two
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;  // a token-id prompt (may be used without a tokenizer)

  // sampling (OpenAI and vLLM semantics)
  std::optional<int32_t> max_tokens;  // max_completion_tokens wins over max_tokens
  std::optional<float> temperature;   // [0, 2]
  std::optional<float> top_p;         // (0, 1]
  std::optional<int32_t> top_k;       // >= 0 (-1 from the client is off: 0)
  std::optional<int64_t> seed;
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  float repetition_penalty = 1.0f;  // (0, 10]
  int32_t n = 1;                    // [1, limits.max_n]
  bool ignore_eos = false;
  std::vector<std::string> stop;    // non-empty strings, at most limits.max_stop
  std::vector<int32_t> stop_token_ids;
  bool skip_special_tokens = true;

  // logprobs: -1 off; k >= 0: the sampled token's logprob plus the top k
  // (chat: logprobs true + top_logprobs k; completions: logprobs k)
  int32_t logprobs = -1;

  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

struct ApiLimits {
  std::vector<std::string> model_names;  // accepted `model` values; empty: any
  bool has_tokenizer = true;   // false: only token-id completion prompts
  int64_t vocab_size = 0;      // > 0: prompt and stop token ids must be below it
  int32_t max_n = 16;
  int32_t max_logprobs = 20;
  int32_t max_stop = 16;
};

// Body (a JSON object) -> ApiRequest, or the 400/404 for the client. Unknown fields are
// ignored; known fields the engine cannot honour are refused by name (logit_bias,
// response_format other than text, tool_choice forcing a call, functions, audio, n > 1 with
// best_of, echo, suffix, ...). A missing `model` means the first of limits.model_names.
ApiResult<ApiRequest> parse_chat_request(const nlohmann::ordered_json& body,
                                         const ApiLimits& limits);
ApiResult<ApiRequest> parse_completion_request(const nlohmann::ordered_json& body,
                                               const ApiLimits& limits);

// The messages in the OpenAI shape the chat templates read (ChatTemplate::render_ordered):
// [{"role", "content" (string or null), "name"?, "reasoning_content"?,
//   "tool_calls"?: [{"id", "type": "function", "function": {"name", "arguments"}}],
//   "tool_call_id"?}]
nlohmann::ordered_json make_template_messages(const ApiRequest& r);

// The completion budget: max_tokens, or the context's remainder when the client gave none.
// 400 context_length_exceeded when the prompt leaves no room or prompt + max_tokens exceeds
// max_model_len (`param` "messages" or "prompt").
ApiResult<int32_t> resolve_max_tokens(const ApiRequest& r, int64_t prompt_tokens,
                                      int64_t max_model_len);

// ApiRequest -> the engine's options. `max_tokens` from resolve_max_tokens; `seed` used when
// the client sent none. Temperature, top_p and top_k not sent by the client take `defaults`'
// values (e.g. from generation_config.json).
struct SamplingDefaults {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
};
engine::SamplingOptions make_sampling_options(const ApiRequest& r, int32_t max_tokens,
                                              uint64_t seed, const SamplingDefaults& defaults);
struct OutputConfig {
  bool detokenize = true;  // false for a model without a tokenizer
  std::string reasoning_parser;
  std::string tool_call_parser;
};
engine::OutputOptions make_output_options(const ApiRequest& r, const OutputConfig& config);

// ---- responses --------------------------------------------------------------------------

// Per-response facts the caller decides.
struct ResponseMeta {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;    // the served name
  bool include_token_ids = false;  // add `token_ids` to every choice (tokenizer-less models)
  // Text of a token id for top-logprob alternatives; when unset they read "token_id:<id>".
  std::function<std::string(int32_t)> token_text;
};

// One choice, accumulated from its OutputDeltas.
struct ChoiceState {
  std::string text;
  std::string reasoning;
  std::vector<int32_t> token_ids;
  std::vector<engine::TokenLogprob> logprobs;
  std::vector<std::string> token_texts;
  std::vector<engine::ToolCall> tool_calls;
  std::string finish_reason;  // "" while running
  int32_t completion_tokens = 0;
};

// Collects a request's OutputDeltas (any order across choices) for a whole response.
class ResponseAccumulator {
 public:
  explicit ResponseAccumulator(int32_t n) : choices_(static_cast<size_t>(n)) {}
  // Takes one delta. A delta with an index outside [0, n) or an error marks the request failed.
  void add(const engine::OutputDelta& d);
  bool done() const;  // every choice has a finish_reason, or failed
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  const std::vector<ChoiceState>& choices() const { return choices_; }
  int32_t prompt_tokens() const { return prompt_tokens_; }
  int32_t cached_tokens() const { return cached_tokens_; }
  int32_t completion_tokens() const;  // sum over choices

 private:
  std::vector<ChoiceState> choices_;
  int32_t prompt_tokens_ = 0;
  int32_t cached_tokens_ = 0;
  std::string error_;
};

nlohmann::json make_usage(int32_t prompt_tokens, int32_t completion_tokens,
                          int32_t cached_tokens);

// The whole responses ("chat.completion" / "text_completion") of a finished accumulator.
nlohmann::json make_chat_response(const ApiRequest& r, const ResponseMeta& meta,
                                  const ResponseAccumulator& acc);
nlohmann::json make_completion_response(const ApiRequest& r, const ResponseMeta& meta,
                                        const ResponseAccumulator& acc);

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created",
// "owned_by", "max_model_len"}]}.
nlohmann::json make_models_response(const std::vector<std::string>& names, int64_t created,
                                    int64_t max_model_len);

// Logprobs objects for a run of tokens (exposed for tests).
//   chat:        {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
//   completions: {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset}
//                (text_offset counts characters from `first_offset`)
nlohmann::json make_chat_logprobs(const std::vector<engine::TokenLogprob>& lps,
                                  const std::vector<std::string>& token_texts,
                                  const ResponseMeta& meta);
nlohmann::json make_completion_logprobs(const std::vector<engine::TokenLogprob>& lps,
                                        const std::vector<std::string>& token_texts,
                                        const ResponseMeta& meta, int64_t first_offset);

// The streamed form: OutputDeltas -> SSE payloads ("data: " and the blank line are the
// server's), "chat.completion.chunk" / "text_completion" chunks, then finish(): the usage
// chunk (empty choices) when include_usage, and "[DONE]".
class ChunkStreamer {
 public:
  ChunkStreamer(ApiRequest request, ResponseMeta meta);
  // Zero or more payloads for this delta. A delta carrying an error yields one
  // {"error": {...}} payload (then call finish()).
  std::vector<std::string> on_delta(const engine::OutputDelta& d);
  // The closing payloads: [usage chunk,] "[DONE]".
  std::vector<std::string> finish();
  bool done() const;  // every choice finished (or an error was seen)

 private:
  std::string chunk_text(nlohmann::json choices) const;
  struct PerChoice {
    bool role_sent = false;
    bool finished = false;
    int32_t tool_calls_sent = 0;
    int64_t text_offset = 0;  // characters so far (completions logprobs)
    int32_t completion_tokens = 0;
  };
  ApiRequest request_;
  ResponseMeta meta_;
  std::vector<PerChoice> choices_;
  int32_t prompt_tokens_ = 0;
  int32_t cached_tokens_ = 0;
  bool failed_ = false;
};

// Serializes for the wire: compact, invalid UTF-8 replaced by U+FFFD (token texts may split
// a character).
std::string to_json_text(const nlohmann::json& j);

}  // namespace xds::serve

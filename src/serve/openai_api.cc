// The OpenAI API layer, part 1: errors, request validation, the engine's options.
// (Responses: openai_response.cc.)
#include "serve/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "base/json_depth.h"

namespace xds::serve {

// Requests are read as ordered JSON (the client's key order survives into the template).
using json = nlohmann::ordered_json;

// ---- errors -----------------------------------------------------------------------------

ApiError invalid_value(std::string param, std::string message) {
  ApiError e;
  e.code = "invalid_value";
  e.message = fmt::format("Invalid value for '{}': {}", param, message);
  e.param = std::move(param);
  return e;
}

ApiError invalid_type(std::string param, std::string expected) {
  ApiError e;
  e.code = "invalid_type";
  e.message = fmt::format("Invalid type for '{}': expected {}.", param, expected);
  e.param = std::move(param);
  return e;
}

ApiError unsupported(std::string param, std::string message) {
  ApiError e;
  e.code = "unsupported_parameter";
  e.message = fmt::format("Unsupported parameter '{}': {}", param, message);
  e.param = std::move(param);
  return e;
}

ApiError missing_parameter(std::string param) {
  ApiError e;
  e.code = "missing_required_parameter";
  e.message = fmt::format("Missing required parameter: '{}'.", param);
  e.param = std::move(param);
  return e;
}

ApiError malformed_json(std::string detail) {
  ApiError e;
  e.message = fmt::format(
      "We could not parse the JSON body of your request. ({}) The body must be a JSON object.",
      detail);
  return e;
}

ApiError model_not_found(std::string_view model) {
  ApiError e;
  e.http_status = 404;
  e.code = "model_not_found";
  e.param = "model";
  e.message = fmt::format("The model `{}` does not exist.", model);
  return e;
}

ApiError invalid_api_key() {
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message =
      "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.";
  return e;
}

ApiError queue_full(int retry_after_s) {
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.code = "queue_full";
  e.retry_after_s = std::max(1, retry_after_s);
  e.message = fmt::format("The server is overloaded: too many requests are waiting. "
                          "Retry after {} s.",
                          e.retry_after_s);
  return e;
}

ApiError context_length_exceeded(std::string param, int64_t prompt_tokens, int64_t max_tokens,
                                 int64_t max_model_len) {
  ApiError e;
  e.code = "context_length_exceeded";
  e.message = fmt::format(
      "This model's maximum context length is {} tokens. However, you requested {} tokens "
      "({} in the {}, {} in the completion). Please reduce the length of the {} or "
      "completion.",
      max_model_len, prompt_tokens + max_tokens, prompt_tokens, param, max_tokens, param);
  e.param = std::move(param);
  return e;
}

ApiError server_error(std::string message) {
  ApiError e;
  e.http_status = 500;
  e.type = "server_error";
  e.message = std::move(message);
  return e;
}

ApiError api_error(int http_status, std::string message, std::string type, std::string code,
                   std::string param) {
  ApiError e;
  e.http_status = http_status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

ApiError api_error_from_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument: {
      ApiError e;
      e.message = status.message();
      return e;
    }
    case StatusCode::kNotFound: {
      ApiError e;
      e.http_status = 404;
      e.code = "not_found";
      e.message = status.message();
      return e;
    }
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable: {
      ApiError e = queue_full(1);
      e.code = status.code() == StatusCode::kUnavailable ? "unavailable" : "queue_full";
      e.message = status.message();
      return e;
    }
    default:
      return server_error(status.to_string());
  }
}

nlohmann::json make_error(const ApiError& e) {
  using nlohmann::json;
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", or_null(e.param)},
            {"code", or_null(e.code)}}}};
}

HttpResponse make_error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.http_status;
  r.body = to_json_text(make_error(e));
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  return r;
}

std::string to_json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiResult<json> parse_json_body(std::string_view body) {
  // Deeper bodies would exhaust the stack of what copies and prints them (base/json_depth.h).
  if (json_nesting_exceeds(body, kMaxJsonDepth)) {
    return malformed_json(fmt::format("nested deeper than {} levels", kMaxJsonDepth));
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return malformed_json("invalid JSON");
  if (!j.is_object()) return malformed_json(fmt::format("got a JSON {}", j.type_name()));
  return j;
}

bool check_api_key(std::string_view authorization_header, std::string_view api_key) {
  if (api_key.empty()) return true;
  std::string_view h = authorization_header;
  while (!h.empty() && h.front() == ' ') h.remove_prefix(1);
  constexpr std::string_view kBearer = "bearer ";
  if (h.size() < kBearer.size()) return false;
  for (size_t i = 0; i < kBearer.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(h[i])) != kBearer[i]) return false;
  }
  h.remove_prefix(kBearer.size());
  while (!h.empty() && h.back() == ' ') h.remove_suffix(1);
  // Constant time in the key's length: every byte of the key is compared.
  unsigned diff = h.size() == api_key.size() ? 0u : 1u;
  for (size_t i = 0; i < api_key.size(); ++i) {
    unsigned char a = i < h.size() ? static_cast<unsigned char>(h[i]) : 0;
    diff |= a ^ static_cast<unsigned char>(api_key[i]);
  }
  return diff == 0;
}

// ---- field reading ------------------------------------------------------------------------

namespace {

// Reads typed fields of one JSON object; the first problem is kept as the error.
class FieldReader {
 public:
  explicit FieldReader(const json& obj) : obj_(obj) {}

  bool failed() const { return error_.has_value(); }
  const ApiError& error() const { return *error_; }
  void fail(ApiError e) {
    if (!error_) error_ = std::move(e);
  }

  // The field, or nullptr when absent or null.
  const json* get(const char* name) const {
    auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<double> number(const char* name, double lo, double hi) {
    const json* v = get(name);
    if (!v || failed()) return std::nullopt;
    if (!v->is_number()) {
      fail(invalid_type(name, "a number"));
      return std::nullopt;
    }
    double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {
      fail(invalid_value(name, fmt::format("must be between {} and {}, got {}.", lo, hi, x)));
      return std::nullopt;
    }
    return x;
  }

  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) {
    const json* v = get(name);
    if (!v || failed()) return std::nullopt;
    return integer_value(*v, name, lo, hi);
  }

  std::optional<int64_t> integer_value(const json& v, const std::string& name, int64_t lo,
                                       int64_t hi) {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() &&
          v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(invalid_value(name, fmt::format("must be at most {}.", hi)));
        return std::nullopt;
      }
      int64_t x = v.get<int64_t>();
      if (x < lo || x > hi) {
        fail(invalid_value(name, fmt::format("must be between {} and {}, got {}.", lo, hi, x)));
        return std::nullopt;
      }
      return x;
    }
    if (v.is_number_float()) {  // 5.0 is accepted as 5
      const double d = v.get<double>();
      // [-2^63, 2^63): the doubles that convert to int64_t (2^63 itself would not, and
      // double(INT64_MAX) rounds up to it).
      if (std::floor(d) == d && d >= -0x1p63 && d < 0x1p63) {
        const auto x = static_cast<int64_t>(d);
        if (x >= lo && x <= hi) return x;
      }
    }
    fail(invalid_type(name, "an integer"));
    return std::nullopt;
  }

  std::optional<bool> boolean(const char* name) {
    const json* v = get(name);
    if (!v || failed()) return std::nullopt;
    if (!v->is_boolean()) {
      fail(invalid_type(name, "a boolean"));
      return std::nullopt;
    }
    return v->get<bool>();
  }

  std::optional<std::string> string(const char* name) {
    const json* v = get(name);
    if (!v || failed()) return std::nullopt;
    if (!v->is_string()) {
      fail(invalid_type(name, "a string"));
      return std::nullopt;
    }
    return v->get<std::string>();
  }

 private:
  const json& obj_;
  std::optional<ApiError> error_;
};

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

void read_model(FieldReader& f, const ApiLimits& limits, ApiRequest& r) {
  std::optional<std::string> model = f.string("model");
  if (f.failed()) return;
  if (!model) {
    r.model = limits.model_names.empty() ? std::string() : limits.model_names.front();
    return;
  }
  r.model = *model;
  if (!limits.model_names.empty() &&
      std::find(limits.model_names.begin(), limits.model_names.end(), r.model) ==
          limits.model_names.end()) {
    f.fail(model_not_found(r.model));
  }
}

void read_token_ids(FieldReader& f, const json& arr, const std::string& param,
                    const ApiLimits& limits, std::vector<int32_t>& out) {
  int64_t hi = limits.vocab_size > 0 ? limits.vocab_size - 1 : kInt32Max;
  for (size_t i = 0; i < arr.size() && !f.failed(); ++i) {
    std::optional<int64_t> id = f.integer_value(arr[i], param, 0, hi);
    if (id) out.push_back(static_cast<int32_t>(*id));
  }
}

// The fields both endpoints share.
void read_common(FieldReader& f, const ApiLimits& limits, ApiRequest& r) {
  read_model(f, limits, r);
  if (auto v = f.integer("max_tokens", 1, kInt32Max)) r.max_tokens = static_cast<int32_t>(*v);
  if (auto v = f.integer("max_completion_tokens", 1, kInt32Max)) {
    r.max_tokens = static_cast<int32_t>(*v);
  }
  if (auto v = f.number("temperature", 0.0, 2.0)) r.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0.0, 1.0)) {
    if (*v == 0.0) {
      f.fail(invalid_value("top_p", "must be greater than 0 and at most 1, got 0."));
    } else {
      r.top_p = static_cast<float>(*v);
    }
  }
  if (auto v = f.integer("top_k", -1, kInt32Max)) r.top_k = static_cast<int32_t>(std::max<int64_t>(*v, 0));
  if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max())) {
    r.seed = *v;
  }
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) r.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) {
    r.frequency_penalty = static_cast<float>(*v);
  }
  if (auto v = f.number("repetition_penalty", 0.0, 10.0)) {
    if (*v == 0.0) {
      f.fail(invalid_value("repetition_penalty", "must be greater than 0 and at most 10, got 0."));
    } else {
      r.repetition_penalty = static_cast<float>(*v);
    }
  }
  if (auto v = f.integer("n", 1, limits.max_n)) r.n = static_cast<int32_t>(*v);
  if (auto v = f.boolean("ignore_eos")) r.ignore_eos = *v;
  if (auto v = f.boolean("skip_special_tokens")) r.skip_special_tokens = *v;

  if (const json* stop = f.get("stop"); stop && !f.failed()) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return f.fail(invalid_type("stop", "a string or a list of strings"));
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return f.fail(invalid_type("stop", "a string or a list of strings"));
    }
    if (std::any_of(r.stop.begin(), r.stop.end(), [](const auto& s) { return s.empty(); })) {
      return f.fail(invalid_value("stop", "stop strings must not be empty."));
    }
    if (static_cast<int64_t>(r.stop.size()) > limits.max_stop) {
      return f.fail(invalid_value(
          "stop", fmt::format("at most {} stop strings, got {}.", limits.max_stop, r.stop.size())));
    }
  }
  if (const json* ids = f.get("stop_token_ids"); ids && !f.failed()) {
    if (!ids->is_array()) return f.fail(invalid_type("stop_token_ids", "a list of integers"));
    read_token_ids(f, *ids, "stop_token_ids", limits, r.stop_token_ids);
  }

  if (auto v = f.boolean("stream")) r.stream = *v;
  if (const json* so = f.get("stream_options"); so && !f.failed()) {
    if (!so->is_object()) return f.fail(invalid_type("stream_options", "an object"));
    if (!r.stream) {
      return f.fail(invalid_value("stream_options", "only allowed when 'stream' is true."));
    }
    FieldReader sf(*so);
    if (auto v = sf.boolean("include_usage")) r.include_usage = *v;
    if (sf.failed()) return f.fail(invalid_type("stream_options.include_usage", "a boolean"));
  }

  // Known fields the engine cannot honour.
  if (const json* lb = f.get("logit_bias"); lb && !f.failed()) {
    if (!lb->is_object()) return f.fail(invalid_type("logit_bias", "an object"));
    if (!lb->empty()) return f.fail(unsupported("logit_bias", "logit biases are not supported."));
  }
  if (const json* rf = f.get("response_format"); rf && !f.failed()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string()) {
      return f.fail(invalid_type("response_format", "an object with a string 'type'"));
    }
    if ((*rf)["type"] != "text") {
      return f.fail(unsupported("response_format",
                                fmt::format("only type 'text' is supported, got '{}'.",
                                            (*rf)["type"].get<std::string>())));
    }
  }
}

// Text of a message's content: a string or a list of text parts.
void read_content(FieldReader& f, const json& content, const std::string& param,
                  std::optional<std::string>& out) {
  if (content.is_null()) return;
  if (content.is_string()) {
    out = content.get<std::string>();
    return;
  }
  if (!content.is_array()) return f.fail(invalid_type(param, "a string or a list of parts"));
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    std::string pp = fmt::format("{}[{}]", param, j);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return f.fail(invalid_type(pp, "an object with a string 'type'"));
    }
    std::string type = part["type"].get<std::string>();
    if (type != "text") {
      return f.fail(unsupported(pp + ".type",
                                fmt::format("content parts of type '{}' are not supported; "
                                            "only 'text'.",
                                            type)));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return f.fail(invalid_type(pp + ".text", "a string"));
    }
    if (j > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  out = std::move(text);
}

void read_tool_calls(FieldReader& f, const json& calls, const std::string& param,
                     std::vector<engine::ToolCall>& out) {
  if (!calls.is_array()) return f.fail(invalid_type(param, "a list"));
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    std::string pp = fmt::format("{}[{}]", param, k);
    if (!c.is_object()) return f.fail(invalid_type(pp, "an object"));
    if (c.contains("type") && c["type"] != "function") {
      return f.fail(unsupported(pp + ".type", "only 'function' tool calls are supported."));
    }
    const json* fn = c.contains("function") ? &c["function"] : nullptr;
    if (!fn || !fn->is_object()) return f.fail(missing_parameter(pp + ".function"));
    if (!fn->contains("name") || !(*fn)["name"].is_string()) {
      return f.fail(invalid_type(pp + ".function.name", "a string"));
    }
    engine::ToolCall call;
    call.id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "";
    call.name = (*fn)["name"].get<std::string>();
    if (fn->contains("arguments")) {
      const json& a = (*fn)["arguments"];
      if (a.is_string()) {
        call.arguments = a.get<std::string>();
      } else if (a.is_object()) {
        call.arguments = a.dump();
      } else {
        return f.fail(invalid_type(pp + ".function.arguments", "a string"));
      }
    }
    out.push_back(std::move(call));
  }
}

void read_messages(FieldReader& f, const json& body, ApiRequest& r) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return f.fail(missing_parameter("messages"));
  if (!it->is_array()) return f.fail(invalid_type("messages", "a list of messages"));
  if (it->empty()) return f.fail(invalid_value("messages", "must contain at least one message."));
  for (size_t i = 0; i < it->size() && !f.failed(); ++i) {
    const json& m = (*it)[i];
    std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) return f.fail(invalid_type(p, "an object"));
    if (!m.contains("role")) return f.fail(missing_parameter(p + ".role"));
    if (!m["role"].is_string()) return f.fail(invalid_type(p + ".role", "a string"));
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool") {
      return f.fail(invalid_value(
          p + ".role",
          fmt::format("'{}' is not one of 'system', 'developer', 'user', 'assistant', 'tool'.",
                      msg.role)));
    }
    if (m.contains("content")) read_content(f, m["content"], p + ".content", msg.content);
    if (f.failed()) return;
    if (m.contains("name") && !m["name"].is_null()) {
      if (!m["name"].is_string()) return f.fail(invalid_type(p + ".name", "a string"));
      msg.name = m["name"].get<std::string>();
    }
    if (msg.role == "assistant") {
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        read_tool_calls(f, m["tool_calls"], p + ".tool_calls", msg.tool_calls);
        if (f.failed()) return;
      }
      if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
        msg.reasoning_content = m["reasoning_content"].get<std::string>();
      }
    } else if (!msg.content) {
      return f.fail(missing_parameter(p + ".content"));
    }
    if (msg.role == "tool") {
      if (!m.contains("tool_call_id")) return f.fail(missing_parameter(p + ".tool_call_id"));
      if (!m["tool_call_id"].is_string()) {
        return f.fail(invalid_type(p + ".tool_call_id", "a string"));
      }
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    }
    r.messages.push_back(std::move(msg));
  }
}

void read_tools(FieldReader& f, ApiRequest& r) {
  if (const json* tools = f.get("tools"); tools && !f.failed()) {
    if (!tools->is_array()) return f.fail(invalid_type("tools", "a list of tools"));
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      std::string p = fmt::format("tools[{}]", i);
      if (!t.is_object()) return f.fail(invalid_type(p, "an object"));
      if (!t.contains("type") || t["type"] != "function") {
        return f.fail(unsupported(p + ".type", "only 'function' tools are supported."));
      }
      if (!t.contains("function") || !t["function"].is_object()) {
        return f.fail(missing_parameter(p + ".function"));
      }
      const json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
        return f.fail(invalid_value(p + ".function.name", "must be a non-empty string."));
      }
      ToolSpec spec;
      spec.name = fn["name"].get<std::string>();
      if (fn.contains("description") && fn["description"].is_string()) {
        spec.description = fn["description"].get<std::string>();
      }
      if (fn.contains("parameters") && !fn["parameters"].is_null()) {
        if (!fn["parameters"].is_object()) {
          return f.fail(invalid_type(p + ".function.parameters", "an object (a JSON schema)"));
        }
        spec.parameters = fn["parameters"];
      }
      r.tools.push_back(std::move(spec));
    }
    r.tools_json = *tools;
  }
  if (const json* tc = f.get("tool_choice"); tc && !f.failed()) {
    if (tc->is_string()) {
      std::string c = tc->get<std::string>();
      if (c == "none" || c == "auto") {
        r.tool_choice = c;
      } else if (c == "required") {
        return f.fail(unsupported("tool_choice",
                                  "'required' is not supported (no constrained decoding); use "
                                  "'auto'."));
      } else {
        return f.fail(invalid_value("tool_choice",
                                    fmt::format("'{}' is not one of 'none', 'auto'.", c)));
      }
    } else if (tc->is_object()) {
      return f.fail(unsupported("tool_choice",
                                "forcing a named function is not supported (no constrained "
                                "decoding); use 'auto'."));
    } else {
      return f.fail(invalid_type("tool_choice", "a string"));
    }
  }
  for (const char* legacy : {"functions", "function_call"}) {
    if (f.get(legacy) && !f.failed()) {
      return f.fail(unsupported(legacy, "deprecated; use 'tools' and 'tool_choice'."));
    }
  }
}

}  // namespace

// ---- requests ---------------------------------------------------------------------------

ApiResult<ApiRequest> parse_chat_request(const json& body, const ApiLimits& limits) {
  ApiRequest r;
  r.kind = ApiKind::kChat;
  FieldReader f(body);
  read_common(f, limits, r);
  if (f.failed()) return f.error();
  if (!limits.has_tokenizer) {
    return invalid_value("messages",
                         "this model has no tokenizer: use /v1/completions with a prompt of "
                         "token ids.");
  }
  read_messages(f, body, r);
  if (f.failed()) return f.error();
  read_tools(f, r);
  if (auto v = f.boolean("logprobs"); v && *v) r.logprobs = 0;
  if (auto v = f.integer("top_logprobs", 0, limits.max_logprobs)) {
    if (r.logprobs < 0) {
      return invalid_value("top_logprobs", "'logprobs' must be true when 'top_logprobs' is set.");
    }
    r.logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = f.boolean("add_generation_prompt")) r.add_generation_prompt = *v;
  if (const json* k = f.get("chat_template_kwargs"); k && !f.failed()) {
    if (!k->is_object()) return invalid_type("chat_template_kwargs", "an object");
    r.chat_template_kwargs = *k;
  }
  if (const json* a = f.get("audio"); a && !f.failed()) {
    return unsupported("audio", "audio output is not supported.");
  }
  if (const json* m = f.get("modalities"); m && !f.failed()) {
    if (!m->is_array()) return invalid_type("modalities", "a list of strings");
    for (const json& x : *m) {
      if (x != "text") return unsupported("modalities", "only 'text' is supported.");
    }
  }
  if (f.get("prediction") && !f.failed()) {
    return unsupported("prediction", "predicted outputs are not supported.");
  }
  if (f.failed()) return f.error();
  return r;
}

ApiResult<ApiRequest> parse_completion_request(const json& body, const ApiLimits& limits) {
  ApiRequest r;
  r.kind = ApiKind::kCompletion;
  FieldReader f(body);
  read_common(f, limits, r);
  if (f.failed()) return f.error();

  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return missing_parameter("prompt");
  const json& p = *it;
  const json* single = &p;
  if (p.is_array()) {
    if (p.empty()) return invalid_value("prompt", "must not be empty.");
    bool all_ints = std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number(); });
    if (!all_ints) {
      if (p.size() > 1) {
        return unsupported("prompt",
                           "a list of several prompts is not supported; send one prompt per "
                           "request.");
      }
      single = &p[0];
      if (!single->is_string() && !single->is_array()) {
        return invalid_type("prompt", "a string, a list of token ids, or a list of one of them");
      }
    }
  }
  if (single->is_string()) {
    if (!limits.has_tokenizer) {
      return invalid_value("prompt",
                           "this model has no tokenizer: send the prompt as a list of token ids.");
    }
    if (single->get_ref<const std::string&>().empty()) {
      return invalid_value("prompt", "must not be empty.");
    }
    r.prompt_text = single->get<std::string>();
  } else if (single->is_array()) {
    if (single->empty()) return invalid_value("prompt", "must not be empty.");
    read_token_ids(f, *single, "prompt", limits, r.prompt_ids);
    if (f.failed()) return f.error();
  } else {
    return invalid_type("prompt", "a string or a list of token ids");
  }

  if (const json* lp = f.get("logprobs"); lp && !f.failed()) {
    if (auto v = f.integer("logprobs", 0, limits.max_logprobs)) r.logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = f.integer("best_of", 1, kInt32Max)) {
    if (*v < r.n) return invalid_value("best_of", "must be greater than or equal to 'n'.");
    if (*v > r.n) {
      return unsupported("best_of", "best_of greater than n is not supported.");
    }
  }
  if (auto v = f.boolean("echo"); v && *v) {
    return unsupported("echo", "echoing the prompt is not supported.");
  }
  if (auto v = f.string("suffix"); v && !v->empty()) {
    return unsupported("suffix", "suffixes (insertion) are not supported.");
  }
  if (f.failed()) return f.error();
  return r;
}

ApiResult<int32_t> resolve_max_tokens(const ApiRequest& r, int64_t prompt_tokens,
                                      int64_t max_model_len) {
  const char* param = r.kind == ApiKind::kChat ? "messages" : "prompt";
  int64_t room = max_model_len - prompt_tokens;
  if (r.max_tokens) {
    if (*r.max_tokens > room) {
      return context_length_exceeded(param, prompt_tokens, *r.max_tokens, max_model_len);
    }
    return *r.max_tokens;
  }
  if (room < 1) return context_length_exceeded(param, prompt_tokens, 1, max_model_len);
  return static_cast<int32_t>(std::min<int64_t>(room, kInt32Max));
}

engine::SamplingOptions make_sampling_options(const ApiRequest& r, int32_t max_tokens,
                                              uint64_t seed, const SamplingDefaults& defaults) {
  engine::SamplingOptions s;
  s.temperature = r.temperature.value_or(defaults.temperature);
  s.top_p = r.top_p.value_or(defaults.top_p);
  s.top_k = r.top_k.value_or(defaults.top_k);
  s.seed = r.seed ? static_cast<uint64_t>(*r.seed) : seed;
  s.presence_penalty = r.presence_penalty;
  s.frequency_penalty = r.frequency_penalty;
  s.repetition_penalty = r.repetition_penalty;
  s.max_tokens = max_tokens;
  s.ignore_eos = r.ignore_eos;
  s.logprobs = r.logprobs;
  s.n = r.n;
  s.stop_token_ids = r.stop_token_ids;
  return s;
}

json make_template_messages(const ApiRequest& r) {
  json out = json::array();
  for (const ChatMessage& m : r.messages) {
    json msg = {{"role", m.role}};
    msg["content"] = m.content ? json(*m.content) : json(nullptr);
    if (!m.name.empty()) msg["name"] = m.name;
    if (!m.reasoning_content.empty()) msg["reasoning_content"] = m.reasoning_content;
    if (!m.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& c : m.tool_calls) {
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) msg["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(msg));
  }
  return out;
}

engine::OutputOptions make_output_options(const ApiRequest& r, const OutputConfig& config) {
  engine::OutputOptions o;
  o.detokenize = config.detokenize;
  o.skip_special_tokens = r.skip_special_tokens;
  o.stop = r.stop;
  o.reasoning_parser = config.reasoning_parser;
  o.tool_call_parser = config.tool_call_parser;
  o.tools_requested = !r.tools.empty() && r.tool_choice != "none";
  o.stream = r.stream;
  return o;
}

}  // namespace xds::serve

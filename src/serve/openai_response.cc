// The OpenAI API layer, part 2: engine output -> response JSON, whole and streamed.
#include <algorithm>

#include <fmt/format.h>

#include "serve/openai_api.h"

namespace xds::serve {

using nlohmann::json;

namespace {

json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

// Characters (code points) in UTF-8 text: bytes that are not continuation bytes.
int64_t char_count(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string text_of(int32_t id, const ResponseMeta& meta) {
  return meta.token_text ? meta.token_text(id) : fmt::format("token_id:{}", id);
}

// The chosen token's text: the output process's, else the meta's lookup.
std::string chosen_text(size_t i, const std::vector<engine::TokenLogprob>& lps,
                        const std::vector<std::string>& token_texts, const ResponseMeta& meta) {
  return i < token_texts.size() ? token_texts[i] : text_of(lps[i].token, meta);
}

json or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json tool_call_json(const engine::ToolCall& c) {
  return {{"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// "stop" with tool calls reads "tool_calls" (the OpenAI convention).
std::string final_reason(const std::string& reason, bool has_tool_calls) {
  return reason == "stop" && has_tool_calls ? "tool_calls" : reason;
}

}  // namespace

json make_usage(int32_t prompt_tokens, int32_t completion_tokens, int32_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json make_chat_logprobs(const std::vector<engine::TokenLogprob>& lps,
                        const std::vector<std::string>& token_texts, const ResponseMeta& meta) {
  json content = json::array();
  for (size_t i = 0; i < lps.size(); ++i) {
    std::string text = chosen_text(i, lps, token_texts, meta);
    json top = json::array();
    for (const auto& [id, lp] : lps[i].top) {
      std::string t = text_of(id, meta);
      top.push_back({{"token", t}, {"logprob", lp}, {"bytes", bytes_of(t)}});
    }
    content.push_back(
        {{"token", text}, {"logprob", lps[i].logprob}, {"bytes", bytes_of(text)},
         {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json make_completion_logprobs(const std::vector<engine::TokenLogprob>& lps,
                              const std::vector<std::string>& token_texts,
                              const ResponseMeta& meta, int64_t first_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  int64_t offset = first_offset;
  for (size_t i = 0; i < lps.size(); ++i) {
    std::string text = chosen_text(i, lps, token_texts, meta);
    json top = json::object();
    for (const auto& [id, lp] : lps[i].top) top[text_of(id, meta)] = lp;
    tokens.push_back(text);
    token_logprobs.push_back(lps[i].logprob);
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += char_count(text);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset)}};
}

// ---- whole responses ----------------------------------------------------------------------

void ResponseAccumulator::add(const engine::OutputDelta& d) {
  if (!d.error.empty()) {
    if (error_.empty()) error_ = d.error;
    return;
  }
  if (d.index < 0 || static_cast<size_t>(d.index) >= choices_.size()) {
    if (error_.empty()) {
      error_ = fmt::format("output for choice {} of a request with {} choices", d.index,
                           choices_.size());
    }
    return;
  }
  ChoiceState& c = choices_[static_cast<size_t>(d.index)];
  c.text += d.text;
  c.reasoning += d.reasoning;
  c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
  c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  c.token_texts.insert(c.token_texts.end(), d.token_texts.begin(), d.token_texts.end());
  c.tool_calls.insert(c.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  if (!d.finish_reason.empty()) c.finish_reason = d.finish_reason;
  c.completion_tokens = std::max(c.completion_tokens, d.completion_tokens);
  prompt_tokens_ = std::max(prompt_tokens_, d.prompt_tokens);
  cached_tokens_ = std::max(cached_tokens_, d.cached_tokens);
}

bool ResponseAccumulator::done() const {
  return failed() || std::all_of(choices_.begin(), choices_.end(),
                                 [](const ChoiceState& c) { return !c.finish_reason.empty(); });
}

int32_t ResponseAccumulator::completion_tokens() const {
  int32_t n = 0;
  for (const ChoiceState& c : choices_) n += c.completion_tokens;
  return n;
}

json make_chat_response(const ApiRequest& r, const ResponseMeta& meta,
                        const ResponseAccumulator& acc) {
  json choices = json::array();
  for (size_t i = 0; i < acc.choices().size(); ++i) {
    const ChoiceState& c = acc.choices()[i];
    json message = {{"role", "assistant"}};
    message["content"] = c.text.empty() && !c.tool_calls.empty() ? json(nullptr) : json(c.text);
    if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& call : c.tool_calls) calls.push_back(tool_call_json(call));
      message["tool_calls"] = std::move(calls);
    }
    json choice = {{"index", i}, {"message", std::move(message)}};
    choice["logprobs"] =
        r.logprobs >= 0 ? make_chat_logprobs(c.logprobs, c.token_texts, meta) : json(nullptr);
    choice["finish_reason"] = or_null(final_reason(c.finish_reason, !c.tool_calls.empty()));
    if (meta.include_token_ids) choice["token_ids"] = c.token_ids;
    choices.push_back(std::move(choice));
  }
  return {{"id", meta.id},
          {"object", "chat.completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(choices)},
          {"usage", make_usage(acc.prompt_tokens(), acc.completion_tokens(), acc.cached_tokens())}};
}

json make_completion_response(const ApiRequest& r, const ResponseMeta& meta,
                              const ResponseAccumulator& acc) {
  json choices = json::array();
  for (size_t i = 0; i < acc.choices().size(); ++i) {
    const ChoiceState& c = acc.choices()[i];
    json choice = {{"index", i}, {"text", c.text}};
    choice["logprobs"] = r.logprobs >= 0
                             ? make_completion_logprobs(c.logprobs, c.token_texts, meta, 0)
                             : json(nullptr);
    choice["finish_reason"] = or_null(c.finish_reason);
    if (meta.include_token_ids) choice["token_ids"] = c.token_ids;
    choices.push_back(std::move(choice));
  }
  return {{"id", meta.id},
          {"object", "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(choices)},
          {"usage", make_usage(acc.prompt_tokens(), acc.completion_tokens(), acc.cached_tokens())}};
}

json make_models_response(const std::vector<std::string>& names, int64_t created,
                          int64_t max_model_len) {
  json data = json::array();
  for (const auto& name : names) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "xdeepserve"},
                    {"max_model_len", max_model_len}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

// ---- streamed responses -------------------------------------------------------------------

ChunkStreamer::ChunkStreamer(ApiRequest request, ResponseMeta meta)
    : request_(std::move(request)),
      meta_(std::move(meta)),
      choices_(static_cast<size_t>(std::max(1, request_.n))) {}

std::string ChunkStreamer::chunk_text(json choices) const {
  json chunk = {{"id", meta_.id},
                {"object", request_.kind == ApiKind::kChat ? "chat.completion.chunk"
                                                           : "text_completion"},
                {"created", meta_.created},
                {"model", meta_.model},
                {"choices", std::move(choices)}};
  if (request_.include_usage) chunk["usage"] = nullptr;
  return to_json_text(chunk);
}

std::vector<std::string> ChunkStreamer::on_delta(const engine::OutputDelta& d) {
  std::vector<std::string> out;
  if (failed_) return out;
  if (!d.error.empty() || d.index < 0 || static_cast<size_t>(d.index) >= choices_.size()) {
    failed_ = true;
    std::string message = !d.error.empty()
                              ? d.error
                              : fmt::format("output for choice {} of a request with {} choices",
                                            d.index, choices_.size());
    out.push_back(to_json_text(make_error(server_error(message))));
    return out;
  }
  PerChoice& pc = choices_[static_cast<size_t>(d.index)];
  if (pc.finished) return out;
  prompt_tokens_ = std::max(prompt_tokens_, d.prompt_tokens);
  cached_tokens_ = std::max(cached_tokens_, d.cached_tokens);
  pc.completion_tokens = std::max(pc.completion_tokens, d.completion_tokens);
  const bool want_logprobs = request_.logprobs >= 0 && !d.logprobs.empty();
  const bool want_ids = meta_.include_token_ids && !d.token_ids.empty();

  if (request_.kind == ApiKind::kCompletion) {
    if (d.text.empty() && !want_logprobs && !want_ids && d.finish_reason.empty()) return out;
    json choice = {{"index", d.index}, {"text", d.text}};
    if (want_logprobs) {
      choice["logprobs"] = make_completion_logprobs(d.logprobs, d.token_texts, meta_,
                                                    pc.text_offset);
    } else {
      choice["logprobs"] = nullptr;
    }
    pc.text_offset += char_count(d.text);
    choice["finish_reason"] = or_null(d.finish_reason);
    if (meta_.include_token_ids) choice["token_ids"] = d.token_ids;
    pc.finished = !d.finish_reason.empty();
    out.push_back(chunk_text(json::array({std::move(choice)})));
    return out;
  }

  const bool has_content = !d.text.empty() || !d.reasoning.empty() || !d.tool_calls.empty() ||
                           want_logprobs || want_ids;
  if (has_content || (!pc.role_sent && !d.finish_reason.empty())) {
    json delta = json::object();
    if (!pc.role_sent) {
      delta["role"] = "assistant";
      delta["content"] = d.text;
      pc.role_sent = true;
    } else if (!d.text.empty()) {
      delta["content"] = d.text;
    }
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& call : d.tool_calls) {
        json c = tool_call_json(call);
        c["index"] = pc.tool_calls_sent++;
        calls.push_back(std::move(c));
      }
      delta["tool_calls"] = std::move(calls);
    }
    json choice = {{"index", d.index}, {"delta", std::move(delta)}};
    choice["logprobs"] =
        want_logprobs ? make_chat_logprobs(d.logprobs, d.token_texts, meta_) : json(nullptr);
    choice["finish_reason"] = nullptr;
    if (meta_.include_token_ids) choice["token_ids"] = d.token_ids;
    out.push_back(chunk_text(json::array({std::move(choice)})));
  }
  if (!d.finish_reason.empty()) {
    pc.finished = true;
    json choice = {{"index", d.index},
                   {"delta", json::object()},
                   {"logprobs", nullptr},
                   {"finish_reason", final_reason(d.finish_reason, pc.tool_calls_sent > 0)}};
    out.push_back(chunk_text(json::array({std::move(choice)})));
  }
  return out;
}

std::vector<std::string> ChunkStreamer::finish() {
  std::vector<std::string> out;
  if (request_.include_usage && !failed_) {
    int32_t completion = 0;
    for (const PerChoice& pc : choices_) completion += pc.completion_tokens;
    json chunk = {{"id", meta_.id},
                  {"object", request_.kind == ApiKind::kChat ? "chat.completion.chunk"
                                                             : "text_completion"},
                  {"created", meta_.created},
                  {"model", meta_.model},
                  {"choices", json::array()},
                  {"usage", make_usage(prompt_tokens_, completion, cached_tokens_)}};
    out.push_back(to_json_text(chunk));
  }
  out.push_back("[DONE]");
  return out;
}

bool ChunkStreamer::done() const {
  return failed_ || std::all_of(choices_.begin(), choices_.end(),
                                [](const PerChoice& pc) { return pc.finished; });
}

}  // namespace xds::serve

// Fuzz target: OpenAI request validation (serve/openai_api.h). Input: a request body, read as
// both a /v1/chat/completions and a /v1/completions request, then taken through what the
// gateway does next with a valid one (template messages, max_tokens, the engine's options).
//
// Checked beyond "no crash, no hang, no exception": a request that validates keeps the
// ranges openai_api.h documents (temperature [0, 2], top_p (0, 1], n [1, max_n], at most
// max_stop non-empty stop strings, token ids below vocab_size, logprobs <= max_logprobs), and
// an error is a 4xx with a message.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"
#include "serve/openai_api.h"

namespace {

using xds::serve::ApiError;
using xds::serve::ApiLimits;
using xds::serve::ApiRequest;

ApiLimits fuzz_limits() {
  ApiLimits limits;
  limits.vocab_size = 1000;
  limits.max_n = 4;
  limits.max_logprobs = 5;
  limits.max_stop = 4;
  return limits;
}

void check_error(const ApiError& e) {
  XDS_CHECK(e.http_status == 400 || e.http_status == 404, "status {}", e.http_status);
  XDS_CHECK(!e.message.empty(), "an error without a message");
  (void)xds::serve::make_error_response(e);
}

void check_ids(const std::vector<int32_t>& ids, const ApiLimits& limits) {
  for (int32_t id : ids) XDS_CHECK(id >= 0 && id < limits.vocab_size, "token id {}", id);
}

// The documented ranges of a validated request, then the gateway's next steps with it.
void check_valid(const ApiRequest& r, const ApiLimits& limits) {
  if (r.temperature) XDS_CHECK(*r.temperature >= 0 && *r.temperature <= 2, "temperature");
  if (r.top_p) XDS_CHECK(*r.top_p > 0 && *r.top_p <= 1, "top_p {}", *r.top_p);
  if (r.top_k) XDS_CHECK(*r.top_k >= 0, "top_k {}", *r.top_k);
  if (r.max_tokens) XDS_CHECK(*r.max_tokens >= 1, "max_tokens {}", *r.max_tokens);
  XDS_CHECK(r.n >= 1 && r.n <= limits.max_n, "n {}", r.n);
  XDS_CHECK(r.logprobs >= -1 && r.logprobs <= limits.max_logprobs, "logprobs {}", r.logprobs);
  XDS_CHECK(static_cast<int32_t>(r.stop.size()) <= limits.max_stop, "{} stops", r.stop.size());
  for (const auto& s : r.stop) XDS_CHECK(!s.empty(), "an empty stop string");
  check_ids(r.stop_token_ids, limits);
  check_ids(r.prompt_ids, limits);
  XDS_CHECK(r.presence_penalty >= -2 && r.presence_penalty <= 2, "presence_penalty");
  XDS_CHECK(r.frequency_penalty >= -2 && r.frequency_penalty <= 2, "frequency_penalty");
  XDS_CHECK(r.repetition_penalty > 0 && r.repetition_penalty <= 10, "repetition_penalty");

  if (r.kind == xds::serve::ApiKind::kChat) {
    (void)xds::serve::to_json_text(nlohmann::json(xds::serve::make_template_messages(r)));
  }
  for (int64_t prompt_tokens : {int64_t{0}, int64_t{7}, int64_t{4096}}) {
    auto max_tokens = xds::serve::resolve_max_tokens(r, prompt_tokens, 4096);
    if (!max_tokens.ok()) {
      check_error(max_tokens.error());
      continue;
    }
    XDS_CHECK(max_tokens.value() >= 1 && prompt_tokens + max_tokens.value() <= 4096,
              "max_tokens {} with {} prompt tokens", max_tokens.value(), prompt_tokens);
    (void)xds::serve::make_sampling_options(r, max_tokens.value(), 7, {});
  }
  (void)xds::serve::make_output_options(r, {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto json = xds::serve::parse_json_body(body);
  if (!json.ok()) {
    check_error(json.error());
    return 0;
  }
  const ApiLimits limits = fuzz_limits();
  for (bool chat : {true, false}) {
    auto r = chat ? xds::serve::parse_chat_request(json.value(), limits)
                  : xds::serve::parse_completion_request(json.value(), limits);
    if (r.ok()) {
      check_valid(r.value(), limits);
    } else {
      check_error(r.error());
    }
  }
  return 0;
}

#include "serve/gateway_http.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <span>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "model/registry.h"
#include "serve/fault_injection.h"
#include "serve/generation_config.h"

namespace xds::serve {

Result<std::unique_ptr<GatewayHttp>> GatewayHttp::create(const GatewayOptions& options,
                                                         Core& core) {
  std::unique_ptr<GatewayHttp> g(new GatewayHttp(options, core));
  XDS_RETURN_IF_ERROR(g->load_model());
  HttpServerOptions ho;
  ho.host = options.host;
  ho.port = static_cast<uint16_t>(options.port);
  ho.threads = std::max(1, options.io_threads);
  g->http_ = std::make_unique<HttpServer>(ho);
  g->routes();
  return g;
}

GatewayHttp::GatewayHttp(const GatewayOptions& options, Core& core)
    : o_(options), core_(core), started_s_(static_cast<int64_t>(std::time(nullptr))) {}

Status GatewayHttp::start() { return http_->start(); }

void GatewayHttp::stop(std::chrono::milliseconds grace) { http_->stop(grace); }

int GatewayHttp::port() const { return http_->port(); }

Status GatewayHttp::load_model() {
  XDS_ASSIGN_OR_RETURN(const ModelInfo info, load_model_info(o_.model_dir));
  max_model_len_ = o_.max_model_len > 0
                       ? std::min<int64_t>(o_.max_model_len, info.max_position_embeddings)
                       : info.max_position_embeddings;
  model_vocab_ = info.vocab_size;
  model_name_ = o_.served_model_name;
  if (model_name_.empty()) {
    model_name_ = std::filesystem::path(o_.model_dir).lexically_normal().filename().string();
    if (model_name_.empty()) {
      model_name_ = std::filesystem::path(o_.model_dir).lexically_normal().parent_path()
                        .filename().string();
    }
  }
  // vLLM's default: sampling fields the client leaves out come from generation_config.json.
  XDS_ASSIGN_OR_RETURN(sampling_defaults_,
                       load_sampling_defaults(o_.model_dir, o_.generation_config));
  if (Tokenizer::has_tokenizer_files(o_.model_dir)) {
    XDS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(o_.model_dir));
    tokenizer_ = std::move(tok);
    auto tmpl = ChatTemplate::load(o_.model_dir, o_.chat_template);
    if (tmpl.ok()) {
      chat_template_ = std::move(*tmpl);
    } else if (!o_.chat_template.empty()) {
      return tmpl.status();
    }
  }
  return {};
}

bool GatewayHttp::authorized(const HttpRequest& r, Responder& responder) const {
  if (o_.api_key.empty()) return true;
  if (check_api_key(r.header("authorization"), o_.api_key)) return true;
  responder.send(make_error_response(invalid_api_key()));
  return false;
}

void GatewayHttp::routes() {
  http_->route("POST", "/v1/chat/completions", [this](HttpRequest r, Responder resp) {
    on_completion(r, std::move(resp), /*chat=*/true);
  });
  http_->route("POST", "/v1/completions", [this](HttpRequest r, Responder resp) {
    on_completion(r, std::move(resp), /*chat=*/false);
  });
  http_->route("GET", "/v1/models", [this](HttpRequest r, Responder resp) {
    if (!authorized(r, resp)) return;
    HttpResponse out;
    out.body = to_json_text(make_models_response({model_name_}, started_s_, max_model_len_));
    resp.send(std::move(out));
  });
  http_->route("GET", "/health",
               [this](HttpRequest, Responder resp) { core_.health(std::move(resp)); });
  http_->route("GET", "/metrics", [this](HttpRequest, Responder resp) {
    HttpResponse out;
    out.content_type = "text/plain; version=0.0.4";
    out.body = core_.metrics_text();
    resp.send(std::move(out));
  });
  http_->route("GET", "/admin/eplb", [this](HttpRequest r, Responder resp) {
    if (authorized(r, resp)) core_.admin(protocol::AdminCall::kEplbState, std::move(resp));
  });
  http_->route("POST", "/admin/eplb/rebalance", [this](HttpRequest r, Responder resp) {
    if (authorized(r, resp)) core_.admin(protocol::AdminCall::kEplbRebalance, std::move(resp));
  });
  if (!o_.fault_injection) return;  // /admin/faults: 404 like any unknown path
  http_->route("POST", "/admin/faults", [this](HttpRequest r, Responder resp) {
    if (!authorized(r, resp)) return;
    Result<protocol::FaultSpec> f =
        parse_fault(r.body, static_cast<int32_t>(o_.instances.size()));
    if (!f.ok()) {
      resp.send(make_error_response(
          api_error(400, f.status().message(), "invalid_request_error", "invalid_fault")));
      return;
    }
    core_.inject_fault(*f, std::move(resp));
  });
  http_->route("GET", "/admin/faults", [this](HttpRequest r, Responder resp) {
    if (authorized(r, resp)) core_.list_faults(std::move(resp));
  });
}

void GatewayHttp::on_completion(const HttpRequest& r, Responder responder, bool chat) {
  auto reject = [&](const ApiError& e) {
    core_.count_rejected(e);
    responder.send(make_error_response(e));
  };
  if (!o_.api_key.empty() && !check_api_key(r.header("authorization"), o_.api_key)) {
    return reject(invalid_api_key());
  }
  if (!core_.accepting()) {
    return reject(api_error(503, "the server is shutting down", "server_error", "shutting_down"));
  }
  ApiResult<PreparedRequest> prepared = prepare(r, chat);
  if (!prepared.ok()) return reject(prepared.error());
  core_.admit(std::move(prepared.value()), std::move(responder));
}

ApiResult<std::vector<int32_t>> GatewayHttp::prompt_ids(const ApiRequest& api, bool chat) const {
  if (chat) {
    if (!tokenizer_ || !chat_template_) {
      return api_error(
          400, "this model has no tokenizer or chat template: use /v1/completions with token ids",
          "invalid_request_error", "unsupported_parameter", "messages");
    }
    nlohmann::ordered_json tools = nullptr;
    if (!api.tools.empty()) tools = nlohmann::ordered_json::parse(api.tools_json.dump());
    const MessageTrust trust =
        o_.trust_request_special_tokens ? MessageTrust::kTrusted : MessageTrust::kUntrusted;
    auto enc = encode_chat_ordered(*tokenizer_, *chat_template_, make_template_messages(api),
                                   api.add_generation_prompt, tools, trust);
    if (!enc.ok()) {
      return api_error(400, std::string(enc.status().message()), "invalid_request_error",
                       "invalid_value", "messages");
    }
    return std::move(*enc);
  }
  if (!api.prompt_ids.empty()) return api.prompt_ids;
  if (!tokenizer_) {
    return api_error(400, "this model has no tokenizer: give the prompt as an array of token ids",
                     "invalid_request_error", "invalid_type", "prompt");
  }
  // The prompt text is the caller's: untrusted unless the operator said otherwise. The
  // post-processor's BOS is the server's own and still added.
  std::string text = api.prompt_text.value_or("");
  const PromptText prompt = o_.trust_request_special_tokens
                                ? PromptText::trusted(std::move(text))
                                : PromptText::from_request(std::move(text));
  auto enc = tokenizer_->encode(prompt, /*add_special_tokens=*/true);
  if (!enc.ok()) {
    return api_error(400, std::string(enc.status().message()), "invalid_request_error",
                     "invalid_value", "prompt");
  }
  return std::move(*enc);
}

ApiResult<PreparedRequest> GatewayHttp::prepare(const HttpRequest& r, bool chat) const {
  auto body = parse_json_body(r.body);
  if (!body.ok()) return body.error();
  ApiLimits limits;
  limits.model_names = {model_name_};
  limits.has_tokenizer = tokenizer_.has_value();
  limits.vocab_size = tokenizer_ ? std::max<int64_t>(tokenizer_->vocab_size(), model_vocab_)
                                 : model_vocab_;
  ApiResult<ApiRequest> parsed = chat ? parse_chat_request(body.value(), limits)
                                      : parse_completion_request(body.value(), limits);
  if (!parsed.ok()) return parsed.error();
  PreparedRequest p;
  p.api = std::move(parsed.value());
  ApiResult<std::vector<int32_t>> ids = prompt_ids(p.api, chat);
  if (!ids.ok()) return ids.error();
  const int64_t n_prompt = static_cast<int64_t>(ids.value().size());
  if (n_prompt == 0) {
    return api_error(400, "the prompt is empty", "invalid_request_error", "invalid_value",
                     chat ? "messages" : "prompt");
  }
  ApiResult<int32_t> max_tokens = resolve_max_tokens(p.api, n_prompt, max_model_len_);
  if (!max_tokens.ok()) return max_tokens.error();

  engine::EngineRequest& e = p.req;
  e.id = core_.next_id(chat ? "chatcmpl" : "cmpl");
  e.prompt = std::move(ids.value());
  e.sampling = make_sampling_options(p.api, max_tokens.value(), core_.draw_seed(),
                                     sampling_defaults_);
  OutputConfig oc;
  oc.detokenize = tokenizer_.has_value();
  oc.reasoning_parser = o_.reasoning_parser;
  oc.tool_call_parser = o_.tool_call_parser;
  e.output = make_output_options(p.api, oc);
  // DeepSeek-R1's template opens <think> in the prompt: the output then starts as reasoning.
  if (chat && tokenizer_ && !o_.reasoning_parser.empty()) {
    const size_t k = std::min<size_t>(e.prompt.size(), 8);
    const std::string tail = tokenizer_->decode(
        std::span<const int32_t>(e.prompt).subspan(e.prompt.size() - k), false);
    const size_t open = tail.rfind("<think>"), close = tail.rfind("</think>");
    e.output.prompt_in_reasoning =
        open != std::string::npos && (close == std::string::npos || close < open);
  }
  e.reply_to = core_.reply_to();
  p.arrival_ns = now_ns();
  e.arrival_us = p.arrival_ns / 1000;
  p.prompt_tokens = static_cast<int32_t>(n_prompt);
  p.meta.id = e.id;
  p.meta.created = static_cast<int64_t>(std::time(nullptr));
  p.meta.model = model_name_;
  p.meta.include_token_ids = !tokenizer_.has_value();
  if (tokenizer_) {
    const Tokenizer* tok = &*tokenizer_;
    p.meta.token_text = [tok](int32_t id) {
      return tok->decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
    };
  }
  return p;
}

}  // namespace xds::serve

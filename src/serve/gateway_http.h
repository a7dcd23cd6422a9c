// The gateway's HTTP side: the OpenAI-compatible routes and what turns a completion body into
// an engine request.
//
//   POST /v1/chat/completions, /v1/completions  parse (serve/openai_api.h), apply the chat
//        template and tokenize (the length rejects an over-long prompt and places the
//        request), resolve max_tokens, sampling and output options; then the core admits it
//   GET  /v1/models                              the served model
//   GET  /health                                 the core probes every instance
//   GET  /metrics                                the core's exposition text
//   GET  /admin/eplb, POST /admin/eplb/rebalance the core forwards the call to the instance
//
// With an API key every route but /health and /metrics needs `Authorization: Bearer <key>`.
// The core (gateway.cc) owns the messaging, the request state and the queues; this side
// never touches a socket of its own besides the HTTP server's.
//
// Thread-safety: the handlers run on the HTTP server's io threads; prepare() is const and
// uses only what create() loaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "protocol/messages.h"
#include "protocol/payloads.h"
#include "serve/gateway.h"
#include "serve/http_server.h"
#include "serve/openai_api.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace xds::serve {

// A completion request parsed, templated and tokenized: what the core needs to send it and
// to answer it.
struct PreparedRequest {
  ApiRequest api;
  engine::EngineRequest req;  // id, prompt, sampling, output options, reply_to, arrival_us
  ResponseMeta meta;
  int32_t prompt_tokens = 0;
  int64_t arrival_ns = 0;
};

class GatewayHttp {
 public:
  // What the handlers ask of the gateway's core. Called on the io threads.
  class Core {
   public:
    virtual ~Core() = default;
    // False while the gateway stops: completions get 503.
    virtual bool accepting() const = 0;
    // "<prefix>-<n>", n counting up across the gateway's requests and probes.
    virtual std::string next_id(std::string_view prefix) = 0;
    virtual uint64_t draw_seed() = 0;
    // The address the output processes send this gateway's deltas to.
    virtual std::string reply_to() const = 0;
    // Takes the request; the core answers `responder` (queue full, stream, result, error).
    virtual void admit(PreparedRequest r, Responder responder) = 0;
    // /health: every instance answers within the probe's deadline, or 503.
    virtual void health(Responder responder) = 0;
    // An /admin call: the first instance's answer.
    virtual void admin(protocol::AdminCall call, Responder responder) = 0;
    // POST /admin/faults (already parsed and checked): the answer of the shell that strikes,
    // 202 {"id": N}. GET /admin/faults: the faults sent and what followed.
    virtual void inject_fault(protocol::FaultSpec fault, Responder responder) = 0;
    virtual void list_faults(Responder responder) = 0;
    virtual std::string metrics_text() = 0;
    // A completion request answered with `e` before it reached the core (bad body, missing
    // key, shutting down): counted as rejected.
    virtual void count_rejected(const ApiError& e) = 0;
  };

  // Loads the model's facts (config.json, generation_config.json, tokenizer and chat
  // template) and makes the HTTP server with its routes; start() opens it.
  static Result<std::unique_ptr<GatewayHttp>> create(const GatewayOptions& options, Core& core);

  Status start();
  void stop(std::chrono::milliseconds grace);
  int port() const;

  // A completion body (chat or not) -> the request, or the error to answer.
  ApiResult<PreparedRequest> prepare(const HttpRequest& r, bool chat) const;

 private:
  GatewayHttp(const GatewayOptions& options, Core& core);
  Status load_model();
  void routes();
  // False after answering 401 when an API key is set and the request lacks it.
  bool authorized(const HttpRequest& r, Responder& responder) const;
  void on_completion(const HttpRequest& r, Responder responder, bool chat);
  // The prompt ids: the chat template, the text tokenized, or the ids as given.
  ApiResult<std::vector<int32_t>> prompt_ids(const ApiRequest& api, bool chat) const;

  GatewayOptions o_;
  Core& core_;
  std::string model_name_;
  int64_t max_model_len_ = 0;
  int64_t model_vocab_ = 0;
  int64_t started_s_ = 0;
  SamplingDefaults sampling_defaults_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace xds::serve

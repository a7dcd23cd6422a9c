// The gateway (the paper's JE, P096): the OpenAI-compatible HTTP front of one or more
// instances.
//
// It parses the API (serve/openai_api.h), applies the chat template and tokenizes (it needs
// the length to reject an over-long prompt and to place the request), sends each request once
// to the instance's shell, and receives the text deltas straight from the DP groups' output
// processes on its own PULL socket. Requests the shell cannot place wait here, in arrival
// order, and are offered again whenever the groups report new load; past `max_queue` waiting
// requests a new one gets 503 with Retry-After.
//
// Its parts: gateway_http.h (the routes; parsing, templating and tokenizing a request),
// admission_queue.h (requests waiting for room), instance_router.h (the instances' roles and
// loads, where each request and each decode handoff goes, failover) and gateway_link.h (the
// sockets); gateway.cc holds the requests in flight and wires the parts together,
// gateway_recovery.cc answers instance failures and restarts, and gateway_etcd.cc instances
// joining and leaving through etcd (gateway_impl.h: their shared state).
//
// Threads: the HTTP server's io threads run the handlers; one messaging thread owns the
// ZeroMQ sockets (DEALER to the shell, PULL for outputs) and wakes on an eventfd when a handler
// queues a message; the thread in run() sends heartbeats and expires probes; with --etcd, the
// watcher's thread adds and drops instances. Request state,
// the queues and the router are shared under one mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace xds::serve {

struct GatewayOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;            // empty: no authentication
  std::string served_model_name;  // empty: the model directory's last component
  std::string model_dir;          // tokenizer, chat template, config.json
  std::string chat_template;      // a Jinja file overriding the model's
  // The shells' addresses, e.g. tcp://127.0.0.1:8100. Each instance reports its role
  // (colocated, prefill, decode) with its loads; with prefill and decode instances a request
  // is prefilled on one, then continued on the other (docs/design/disaggregation.md).
  std::vector<std::string> instances;
  // Membership in etcd (docs/design/membership.md), instead of `instances`: the instances are
  // the entries under etcd_prefix at http://HOST:PORT, added and dropped as they come and go.
  std::string etcd;
  std::string etcd_prefix = "/xdeepserve/instances/";
  std::string output_host = "127.0.0.1";  // where output processes reach this gateway
  int64_t max_model_len = 0;              // 0: the model's max_position_embeddings
  int64_t max_queue = 1024;               // waiting requests before 503
  // Several instances: prompts this long or longer are "long" for length-aware routing
  // (serve/instance_routing.h).
  int64_t long_prompt_tokens = 2048;
  // The gateway <-> shell heartbeat (answered by the shell's own loop): a ping every
  // instance_heartbeat_ms; an instance that answers none for instance_timeout_s is out, as
  // when its shell reports a FailedMsg (docs/design/reliability.md).
  int64_t instance_heartbeat_ms = 1000;
  int64_t instance_timeout_s = 10;
  // How long the requests of a failed instance (and new ones) wait for an instance to serve
  // them again before they fail with 503.
  int64_t recovery_timeout_s = 120;
  bool fault_injection = false;  // POST/GET /admin/faults (else 404)
  // `serve`: polled by the gateway; non-empty once the instance processes it started have
  // exited for good (the gateway then stops with that error).
  std::function<std::string()> instances_exited;
  int64_t shutdown_timeout_s = 60;  // SIGTERM: how long in-flight requests may finish
  // "auto": generation_config.json's temperature / top_p / top_k are the defaults of requests
  // that leave them out (serve/generation_config.h); "none": the OpenAI defaults.
  std::string generation_config = "auto";
  std::string reasoning_parser;     // "" or deepseek_r1 / qwen3
  std::string tool_call_parser;     // "" or deepseek_v3 / qwen3 / kimi_k2
  // False: special tokens are matched only in the chat template's own text; request text
  // (message content, tools, a raw completion prompt) is tokenized as plain text
  // (docs/design/tokenizer.md, "Untrusted text"). True: matched everywhere, for callers that
  // build prompts with special tokens themselves.
  bool trust_request_special_tokens = false;
  int io_threads = 2;
};

class Gateway {
 public:
  static Result<std::unique_ptr<Gateway>> create(const GatewayOptions& options);
  ~Gateway();
  // Serves until stop(): then stops accepting, lets in-flight requests finish (at most
  // `drain_s` seconds), sends kShutdown to the shell when `shutdown_instance`, and returns.
  Status run(bool shutdown_instance, int drain_s = 60);
  // Async-signal-safe.
  void stop();
  // The port actually bound (options.port 0 picks a free one).
  int port() const;

  struct Impl;

 private:
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace xds::serve

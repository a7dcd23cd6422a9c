#include "serve/gateway.h"

#include <algorithm>
#include <ctime>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/log.h"
#include "model/registry.h"
#include "protocol/messages.h"
#include "serve/gateway_link.h"
#include "serve/gateway_metrics.h"
#include "serve/instance_routing.h"
#include "serve/http_server.h"
#include "serve/openai_api.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace xds::serve {
namespace {

using protocol::Message;
using engine::OutputDelta;
using json = nlohmann::json;

ApiError api_error(int status, std::string message, std::string type, std::string code,
                   std::string param = "") {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}


// The request id of the gateway's heartbeat pings (their pongs only mark the instance alive).
constexpr const char* kHeartbeatId = "heartbeat";

// A request between the HTTP handler and its last delta.
struct Pending {
  ApiRequest api;
  engine::EngineRequest req;
  std::optional<Responder> responder;
  std::shared_ptr<StreamHandle> stream;
  ResponseMeta meta;
  std::optional<ResponseAccumulator> whole;  // not streamed: the choices so far
  std::optional<ChunkStreamer> chunks;       // streamed
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int64_t arrival_ns = 0;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;
  int32_t finished = 0;
  bool queued = false;  // waits in the gateway's queue (rejected by the shell for now)
  bool decode_phase = false;  // the prefill instance handed it off (req.handoff)
  int32_t instance = -1;      // where it was last sent
  int32_t prefilling_on = -1; // counted in that instance's in-flight prefills until a token
  bool long_prompt = false;
  bool done = false;
};

}  // namespace

struct Gateway::Impl {
  GatewayOptions o;
  std::string model_name;
  int64_t max_model_len = 0;
  int64_t model_vocab = 0;
  int64_t started_s = static_cast<int64_t>(std::time(nullptr));
  SamplingDefaults sampling_defaults;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<GatewayLink> link;
  GatewayMetrics metrics;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_id{1};
  std::mt19937_64 seeds{std::random_device{}()};

  std::mutex mu;  // guards everything below
  std::condition_variable idle_cv;
  std::unordered_map<std::string, std::shared_ptr<Pending>> live;
  std::deque<std::string> queue;  // request ids waiting for room, arrival order
  bool retry_in_flight = false;   // the queue's head was offered again and not answered
  struct InstanceView {
    std::string role;  // "" until the shell reports it
    int64_t last_heard_ns = 0;  // the last message from its shell (heartbeats included)
    std::vector<engine::GroupLoad> loads;
    std::unordered_map<uint64_t, int32_t> cached;  // chain hash -> groups holding it (kBlocks)
    int32_t long_inflight = 0, short_inflight = 0;  // prefills sent, first token not back
  };
  std::vector<InstanceView> instances;
  // Handoffs the decode instances could not take yet (P101): while any waits, no new request
  // goes to a prefill instance.
  std::deque<std::string> handoff_queue;
  bool handoff_retry_in_flight = false;
  struct Probe {
    Responder responder;
    int64_t deadline_ns = 0;
    int remaining = 1;  // answers still expected (a /health probe asks every instance)
  };
  std::unordered_map<std::string, Probe> probes;  // /health probes and /admin calls in flight
  std::string failure;  // the instance failed (kFailed): why
  InstanceRoutingPolicy routing;
  std::string eplb_metrics;  // the shell's EPLB lines for /metrics (pushed about once a second)

  Status init();
  void routes();
  void on_completion(HttpRequest request, Responder responder, bool chat);
  void on_message(int from, Message m);
  // The instance of `role` with the fewest requests per group (-1: none).
  int pick_instance(const std::string& role) const;
  // instance_routing.h's choice among the instances of `role` for p's prompt (-1: none).
  int route_instance(const std::string& role, const Pending& p) const;
  // p's prefill is over (first token, failure or cancel): uncount it where it was sent.
  void end_prefill(Pending& p);
  double instance_load(const InstanceView& v) const;
  bool disaggregated() const;
  void on_output(const OutputDelta& d);
  void on_rejected(const protocol::RejectedMsg& m);
  // kFailed from instance `from`. With one instance: every request in flight or queued fails
  // with 503 and the gateway stops. With several: the instance is out; its requests fail,
  // except decode phases that streamed nothing yet, which go to another decode instance.
  void on_instance_failed(int from, const std::string& why);
  // Answers p with `err` (its stream gets the error event and closes), counted as `outcome`.
  void fail_request(const std::shared_ptr<Pending>& p, const ApiError& err,
                    const char* outcome = "error");
  void finish_pending(const std::shared_ptr<Pending>& p, std::unique_lock<std::mutex>& lock);
  void submit(const std::shared_ptr<Pending>& p);
  // Sends the shell a probe (a Ping for /health, to every instance; an AdminRequest for an
  // /admin call, to the first) whose answer goes to `resp`; unanswered after 5 s, the
  // messaging thread's sweep answers 503.
  void probe(std::optional<protocol::AdminCall> admin, Responder resp);
  bool authorized(const HttpRequest& r, Responder& responder);
};

Status Gateway::Impl::init() {
  XDS_ASSIGN_OR_RETURN(const ModelInfo info, load_model_info(o.model_dir));
  max_model_len = o.max_model_len > 0
                      ? std::min<int64_t>(o.max_model_len, info.max_position_embeddings)
                      : info.max_position_embeddings;
  model_vocab = info.vocab_size;
  model_name = o.served_model_name;
  if (model_name.empty()) {
    model_name = std::filesystem::path(o.model_dir).lexically_normal().filename().string();
    if (model_name.empty()) {
      model_name = std::filesystem::path(o.model_dir).lexically_normal().parent_path()
                       .filename().string();
    }
  }
  // vLLM's default: sampling fields the client leaves out come from generation_config.json.
  if (std::ifstream f(o.model_dir + "/generation_config.json"); f) {
    const nlohmann::json g = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (g.is_object()) {
      if (g.value("do_sample", true)) {
        if (auto it = g.find("temperature"); it != g.end() && it->is_number())
          sampling_defaults.temperature = it->get<float>();
        if (auto it = g.find("top_p"); it != g.end() && it->is_number())
          sampling_defaults.top_p = it->get<float>();
        if (auto it = g.find("top_k"); it != g.end() && it->is_number_integer())
          sampling_defaults.top_k = it->get<int32_t>();
      } else {
        sampling_defaults.temperature = 0.0f;
      }
    }
  }
  if (Tokenizer::has_tokenizer_files(o.model_dir)) {
    XDS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(o.model_dir));
    tokenizer = std::move(tok);
    auto tmpl = ChatTemplate::load(o.model_dir, o.chat_template);
    if (tmpl.ok()) {
      chat_template = std::move(*tmpl);
    } else if (!o.chat_template.empty()) {
      return tmpl.status();
    }
  }
  HttpServerOptions ho;
  ho.host = o.host;
  ho.port = static_cast<uint16_t>(o.port);
  ho.threads = std::max(1, o.io_threads);
  http = std::make_unique<HttpServer>(ho);
  routes();
  instances.resize(o.instances.size());
  routing.long_prompt_tokens = o.long_prompt_tokens;
  XDS_ASSIGN_OR_RETURN(link, GatewayLink::start(o.instances, fmt::format("tcp://{}:0", o.output_host),
                                                [this](int from, Message m) {
                                                  on_message(from, std::move(m));
                                                }));
  return http->start();
}

bool Gateway::Impl::authorized(const HttpRequest& r, Responder& responder) {
  if (o.api_key.empty()) return true;
  const std::string auth = r.header("authorization");
  if (check_api_key(auth, o.api_key)) return true;
  (void)auth;
  responder.send(make_error_response(invalid_api_key()));
  return false;
}

void Gateway::Impl::routes() {
  http->route("POST", "/v1/chat/completions", [this](HttpRequest r, Responder resp) {
    if (authorized(r, resp)) on_completion(std::move(r), std::move(resp), /*chat=*/true);
  });
  http->route("POST", "/v1/completions", [this](HttpRequest r, Responder resp) {
    if (authorized(r, resp)) on_completion(std::move(r), std::move(resp), /*chat=*/false);
  });
  http->route("GET", "/v1/models", [this](HttpRequest r, Responder resp) {
    if (!authorized(r, resp)) return;
    HttpResponse out;
    out.body = to_json_text(make_models_response({model_name}, started_s, max_model_len));
    resp.send(std::move(out));
  });
  http->route("GET", "/health", [this](HttpRequest, Responder resp) {
    probe(std::nullopt, std::move(resp));
  });
  http->route("GET", "/metrics", [this](HttpRequest, Responder resp) {
    HttpResponse out;
    out.content_type = "text/plain; version=0.0.4";
    std::vector<engine::GroupLoad> l;
    {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<size_t> cached;
      for (const InstanceView& v : instances) {
        for (const engine::GroupLoad& g : v.loads) {
          l.push_back(g);
          l.back().group = static_cast<int32_t>(l.size() - 1);
        }
        cached.push_back(v.cached.size());
      }
      if (instances.size() > 1) metrics.set_instances_state(handoff_queue.size(), cached);
    }
    out.body = metrics.render(l);
    {
      std::lock_guard<std::mutex> lock(mu);
      out.body += eplb_metrics;
    }
    resp.send(std::move(out));
  });
  http->route("GET", "/admin/eplb", [this](HttpRequest r, Responder resp) {
    if (authorized(r, resp)) probe(protocol::AdminCall::kEplbState, std::move(resp));
  });
  http->route("POST", "/admin/eplb/rebalance", [this](HttpRequest r, Responder resp) {
    if (authorized(r, resp)) {
      probe(protocol::AdminCall::kEplbRebalance, std::move(resp));
    }
  });
}

void Gateway::Impl::probe(std::optional<protocol::AdminCall> admin, Responder resp) {
  const std::string id = fmt::format("{}-{}", admin ? "admin" : "health", next_id.fetch_add(1));
  // /health asks every instance; /admin calls go to the first.
  const bool all = !admin;
  {
    std::lock_guard<std::mutex> lock(mu);
    probes.emplace(id, Probe{resp, now_ns() + int64_t{5'000'000'000},
                             all ? static_cast<int>(instances.size()) : 1});
  }
  Message m;
  if (admin) {
    m = protocol::AdminRequestMsg{id, *admin};
  } else {
    m = protocol::PingMsg{id};
  }
  link->post(all ? GatewayLink::kAllInstances : 0, std::move(m));
}

void Gateway::Impl::on_completion(HttpRequest r, Responder responder, bool chat) {
  if (stopping.load()) {
    responder.send(make_error_response(
        api_error(503, "the server is shutting down", "server_error", "shutting_down")));
    return;
  }
  auto body = parse_json_body(r.body);
  if (!body.ok()) {
    responder.send(make_error_response(body.error()));
    return;
  }
  ApiLimits limits;
  limits.model_names = {model_name};
  limits.has_tokenizer = tokenizer.has_value();
  limits.vocab_size = tokenizer ? std::max<int64_t>(tokenizer->vocab_size(), model_vocab)
                                : model_vocab;
  ApiResult<ApiRequest> parsed =
      chat ? parse_chat_request(body.value(), limits) : parse_completion_request(body.value(), limits);
  if (!parsed.ok()) {
    responder.send(make_error_response(parsed.error()));
    return;
  }
  auto p = std::make_shared<Pending>();
  p->api = std::move(parsed.value());
  const char* prompt_param = chat ? "messages" : "prompt";
  // Prompt ids: the chat template, or the text, or the ids as given.
  std::vector<int32_t> ids;
  if (chat) {
    if (!tokenizer || !chat_template) {
      responder.send(make_error_response(api_error(
          400, "this model has no tokenizer or chat template: use /v1/completions with token ids",
          "invalid_request_error", "unsupported_parameter", "messages")));
      return;
    }
    nlohmann::ordered_json tools = nullptr;
    if (!p->api.tools.empty()) tools = nlohmann::ordered_json::parse(p->api.tools_json.dump());
    auto enc = encode_chat_ordered(*tokenizer, *chat_template, make_template_messages(p->api),
                                   p->api.add_generation_prompt, tools);
    if (!enc.ok()) {
      responder.send(make_error_response(api_error(400, std::string(enc.status().message()),
                                                   "invalid_request_error", "invalid_value",
                                                   "messages")));
      return;
    }
    ids = std::move(*enc);
  } else if (!p->api.prompt_ids.empty()) {
    ids = p->api.prompt_ids;
  } else {
    if (!tokenizer) {
      responder.send(make_error_response(api_error(
          400, "this model has no tokenizer: give the prompt as an array of token ids",
          "invalid_request_error", "invalid_type", "prompt")));
      return;
    }
    auto enc = tokenizer->encode(p->api.prompt_text.value_or(""), /*add_special_tokens=*/true);
    if (!enc.ok()) {
      responder.send(make_error_response(api_error(400, std::string(enc.status().message()),
                                                   "invalid_request_error", "invalid_value",
                                                   "prompt")));
      return;
    }
    ids = std::move(*enc);
  }
  const int64_t n_prompt = static_cast<int64_t>(ids.size());
  if (n_prompt == 0) {
    responder.send(make_error_response(
        api_error(400, "the prompt is empty", "invalid_request_error", "invalid_value",
                  prompt_param)));
    return;
  }
  ApiResult<int32_t> max_tokens = resolve_max_tokens(p->api, n_prompt, max_model_len);
  if (!max_tokens.ok()) {
    responder.send(make_error_response(max_tokens.error()));
    return;
  }

  engine::EngineRequest& e = p->req;
  e.id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id.fetch_add(1));
  e.prompt = std::move(ids);
  uint64_t seed = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    seed = seeds();
  }
  e.sampling = make_sampling_options(p->api, max_tokens.value(), seed, sampling_defaults);
  OutputConfig oc;
  oc.detokenize = tokenizer.has_value();
  oc.reasoning_parser = o.reasoning_parser;
  oc.tool_call_parser = o.tool_call_parser;
  e.output = make_output_options(p->api, oc);
  // DeepSeek-R1's template opens <think> in the prompt: the output then starts as reasoning.
  if (chat && tokenizer && !o.reasoning_parser.empty()) {
    const size_t k = std::min<size_t>(e.prompt.size(), 8);
    const std::string tail = tokenizer->decode(
        std::span<const int32_t>(e.prompt).subspan(e.prompt.size() - k), false);
    const size_t open = tail.rfind("<think>"), close = tail.rfind("</think>");
    e.output.prompt_in_reasoning =
        open != std::string::npos && (close == std::string::npos || close < open);
  }
  e.reply_to = link->reply_to();
  p->arrival_ns = now_ns();
  e.arrival_us = p->arrival_ns / 1000;
  p->prompt_tokens = static_cast<int32_t>(n_prompt);
  p->meta.id = e.id;
  p->meta.created = static_cast<int64_t>(std::time(nullptr));
  p->meta.model = model_name;
  p->meta.include_token_ids = !tokenizer.has_value();
  if (tokenizer) {
    const Tokenizer* tok = &*tokenizer;
    p->meta.token_text = [tok](int32_t id) {
      return tok->decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
    };
  }
  if (p->api.stream) {
    p->chunks.emplace(p->api, p->meta);
  } else {
    p->whole.emplace(p->api.n);
  }
  p->responder = responder;

  {
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<int64_t>(queue.size()) >= o.max_queue && !queue.empty()) {
      responder.send(make_error_response(queue_full(1)));
      metrics.count_outcome("rejected");
      return;
    }
    live[e.id] = p;
  }
  if (p->api.stream) {
    p->stream = responder.start_stream();
    if (!p->stream) return;
  }
  // A client that goes away cancels its request (and frees its KV).
  std::weak_ptr<Pending> weak = p;
  auto on_gone = [this, weak] {
    auto p = weak.lock();
    if (!p) return;
    std::unique_lock<std::mutex> lock(mu);
    if (p->done) return;
    p->done = true;
    end_prefill(*p);
    live.erase(p->req.id);
    queue.erase(std::remove(queue.begin(), queue.end(), p->req.id), queue.end());
    handoff_queue.erase(std::remove(handoff_queue.begin(), handoff_queue.end(), p->req.id),
                        handoff_queue.end());
    lock.unlock();
    metrics.count_outcome("cancelled");
    link->post(GatewayLink::kAllInstances, protocol::CancelMsg{p->req.id});
    idle_cv.notify_all();
  };
  if (p->stream) {
    p->stream->on_disconnect(on_gone);
  } else {
    p->responder->on_disconnect(on_gone);
  }
  submit(p);
}

bool Gateway::Impl::disaggregated() const {
  bool prefill = false, decode = false;
  for (const InstanceView& v : instances) {
    prefill = prefill || v.role == "prefill";
    decode = decode || v.role == "decode";
  }
  return prefill && decode;
}

double Gateway::Impl::instance_load(const InstanceView& v) const {
  double load = 0;
  for (const engine::GroupLoad& g : v.loads) load += g.running + g.waiting + g.kv_parked;
  return load / static_cast<double>(std::max<size_t>(1, v.loads.size()));
}

int Gateway::Impl::route_instance(const std::string& role, const Pending& p) const {
  std::vector<InstanceCandidate> c;
  std::vector<uint64_t> chain;
  for (size_t i = 0; i < instances.size(); ++i) {
    const InstanceView& v = instances[i];
    if (v.role != role) continue;
    if (chain.empty() && !v.loads.empty())
      chain = prompt_block_hashes(p.req.prompt, v.loads.front().block_size);
    // Prefills sent and not started count as load before the instance reports them.
    const double sent = static_cast<double>(v.long_inflight + v.short_inflight) /
                        static_cast<double>(std::max<size_t>(1, v.loads.size()));
    c.push_back({static_cast<int32_t>(i), instance_load(v) + sent, leading_hits(chain, v.cached),
                 v.long_inflight, v.short_inflight});
  }
  const int32_t k = route_to_instance(c, static_cast<int64_t>(p.req.prompt.size()), routing);
  return k < 0 ? -1 : c[static_cast<size_t>(k)].index;
}

void Gateway::Impl::end_prefill(Pending& p) {
  if (p.prefilling_on < 0) return;
  InstanceView& v = instances[static_cast<size_t>(p.prefilling_on)];
  (p.long_prompt ? v.long_inflight : v.short_inflight) -= 1;
  p.prefilling_on = -1;
}

int Gateway::Impl::pick_instance(const std::string& role) const {
  int best = -1;
  double best_load = 0;
  for (size_t i = 0; i < instances.size(); ++i) {
    const InstanceView& v = instances[i];
    if (v.role != role) continue;
    const double load = instance_load(v);
    if (best < 0 || load < best_load) {
      best = static_cast<int>(i);
      best_load = load;
    }
  }
  return best;
}

void Gateway::Impl::submit(const std::shared_ptr<Pending>& p) {
  protocol::RequestMsg m;
  int to = 0;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (instances.size() > 1) {
      if (p->decode_phase) {
        to = pick_instance("decode");
        p->req.phase = engine::RequestPhase::kDecode;
        if (to < 0) {
          p->done = true;
          live.erase(p->req.id);
          lock.unlock();
          fail_request(p, api_error(503, "no decode instance is left to continue this request",
                                    "server_error", "instance_failed"));
          idle_cv.notify_all();
          return;
        }
      } else if (disaggregated()) {
        // Backpressure from the decode side: no new prefill work while handoffs wait.
        if (!handoff_queue.empty() && !p->queued) {
          p->queued = true;
          queue.push_back(p->req.id);
          return;
        }
        to = route_instance("prefill", *p);
        p->req.phase = engine::RequestPhase::kPrefillOnly;
      } else {
        // Colocated, or what is left of a disaggregated deployment: any instance runs a
        // whole request.
        p->req.phase = engine::RequestPhase::kWhole;
        for (const char* role : {"colocated", "decode", "prefill"}) {
          to = route_instance(role, *p);
          if (to >= 0) break;
        }
      }
      if (to < 0) to = 0;  // roles not reported yet
      if (!p->decode_phase && p->prefilling_on < 0) {
        p->long_prompt =
            static_cast<int64_t>(p->req.prompt.size()) >= routing.long_prompt_tokens;
        p->prefilling_on = to;
        (p->long_prompt ? instances[static_cast<size_t>(to)].long_inflight
                        : instances[static_cast<size_t>(to)].short_inflight) += 1;
      }
    }
    p->instance = to;
    m.request = p->req;
  }
  link->post(to, std::move(m));
}

void Gateway::Impl::on_message(int from, Message m) {
  if (from >= 0) {
    std::lock_guard<std::mutex> lock(mu);
    InstanceView& v = instances[static_cast<size_t>(from)];
    v.last_heard_ns = now_ns();
    const auto* load = std::get_if<protocol::LoadMsg>(&m);
    const auto* pong = std::get_if<protocol::PongMsg>(&m);
    if (v.role != "failed" && (load || pong)) {
      v.role = protocol::to_string(load ? load->role : pong->role);
    }
    if (pong && pong->probe_id == kHeartbeatId) return;
  }
  if (const auto* blocks = std::get_if<protocol::BlocksMsg>(&m)) {
    if (from < 0) return;
    std::lock_guard<std::mutex> lock(mu);
    auto& cached = instances[static_cast<size_t>(from)].cached;
    for (uint64_t h : blocks->added) cached[h] += 1;
    for (uint64_t h : blocks->removed) {
      auto it = cached.find(h);
      if (it != cached.end() && --it->second <= 0) cached.erase(it);
    }
  } else if (const auto* out = std::get_if<protocol::OutputMsg>(&m)) {
    for (const OutputDelta& d : out->outputs) on_output(d);
  } else if (const auto* rej = std::get_if<protocol::RejectedMsg>(&m)) {
    on_rejected(*rej);
  } else if (const auto* failed = std::get_if<protocol::FailedMsg>(&m)) {
    on_instance_failed(from, failed->reason);
  } else if (auto* load = std::get_if<protocol::LoadMsg>(&m)) {
    std::shared_ptr<Pending> head;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (from < 0) return;
      std::vector<engine::GroupLoad>& loads = instances[static_cast<size_t>(from)].loads;
      if (loads.size() != load->loads.size()) loads.resize(load->loads.size());
      for (size_t g = 0; g < load->loads.size(); ++g)
        engine::merge_load(loads[g], std::move(load->loads[g]));
      while (!handoff_queue.empty() && !handoff_retry_in_flight) {
        auto it = live.find(handoff_queue.front());
        if (it == live.end()) {
          handoff_queue.pop_front();
          continue;
        }
        head = it->second;
        handoff_retry_in_flight = true;
      }
      if (!head && handoff_queue.empty() && !queue.empty() && !retry_in_flight) {
        auto it = live.find(queue.front());
        if (it != live.end()) {
          head = it->second;
          retry_in_flight = true;
        } else {
          queue.pop_front();
        }
      }
    }
    if (head) submit(head);
  } else if (const auto* pong = std::get_if<protocol::PongMsg>(&m)) {
    std::optional<Responder> r;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = probes.find(pong->probe_id);
      if (it != probes.end() && --it->second.remaining <= 0) {
        r = it->second.responder;
        probes.erase(it);
      }
    }
    if (r) {
      HttpResponse ok;
      ok.body = "{\"status\":\"ok\"}";
      r->send(std::move(ok));
    }
  } else if (auto* push = std::get_if<protocol::EplbStatePushMsg>(&m)) {
    std::lock_guard<std::mutex> lock(mu);
    eplb_metrics = std::move(push->metrics_text);  // the shell's EPLB metrics
  } else if (auto* reply = std::get_if<protocol::AdminReplyMsg>(&m)) {
    std::optional<Responder> r;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = probes.find(reply->call_id);
      if (it != probes.end()) {
        r = it->second.responder;
        probes.erase(it);
      }
    }
    if (r) {
      HttpResponse out;
      out.status = reply->http_status > 0 ? reply->http_status : 200;
      out.body = std::move(reply->body);
      r->send(std::move(out));
    }
  }
}

void Gateway::Impl::fail_request(const std::shared_ptr<Pending>& p, const ApiError& err,
                                 const char* outcome) {
  metrics.count_outcome(outcome);
  if (p->stream) {
    p->stream->send_event(to_json_text(make_error(err)));
    p->stream->close();
  } else {
    p->responder->send(make_error_response(err));
  }
}

void Gateway::Impl::on_instance_failed(int from, const std::string& why) {
  if (instances.size() > 1 && from >= 0) {
    XDS_LOG_ERROR("gateway: instance {} ({}) failed: {}", o.instances[static_cast<size_t>(from)],
                  instances[static_cast<size_t>(from)].role, why);
    std::vector<std::shared_ptr<Pending>> failed, replaced;
    bool any_left = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      instances[static_cast<size_t>(from)].role = "failed";
      instances[static_cast<size_t>(from)].loads.clear();
      instances[static_cast<size_t>(from)].cached.clear();
      for (const InstanceView& v : instances) any_left = any_left || v.role != "failed";
      for (auto it = live.begin(); it != live.end();) {
        const std::shared_ptr<Pending>& p = it->second;
        if (p->instance != from || p->queued) {
          ++it;
          continue;
        }
        const bool untouched = p->decode_phase &&
            p->completion_tokens == static_cast<int32_t>(p->req.handoff.output.size());
        if (untouched && pick_instance("decode") >= 0) {
          replaced.push_back(p);
          ++it;
          continue;
        }
        p->done = true;
        end_prefill(*p);
        failed.push_back(p);
        handoff_queue.erase(std::remove(handoff_queue.begin(), handoff_queue.end(), it->first),
                            handoff_queue.end());
        it = live.erase(it);
      }
    }
    const ApiError err = api_error(
        503, fmt::format("the instance serving this request ({}) failed: {}",
                         o.instances[static_cast<size_t>(from)], why),
        "server_error", "instance_failed");
    for (const std::shared_ptr<Pending>& p : failed) fail_request(p, err);
    for (const std::shared_ptr<Pending>& p : replaced) submit(p);
    if (!any_left) stopping.store(true);
    idle_cv.notify_all();
    return;
  }
  XDS_LOG_ERROR("gateway: the instance failed: {}", why);
  std::vector<std::shared_ptr<Pending>> failed;
  {
    std::lock_guard<std::mutex> lock(mu);
    failure = why;
    for (auto& [id, p] : live) {
      p->done = true;
      failed.push_back(p);
    }
    live.clear();
    queue.clear();
    retry_in_flight = false;
  }
  stopping.store(true);
  const ApiError err =
      api_error(503, "the instance failed: " + why, "server_error", "instance_failed");
  for (const std::shared_ptr<Pending>& p : failed) {
    fail_request(p, err, "error");
  }
  idle_cv.notify_all();
}

void Gateway::Impl::on_rejected(const protocol::RejectedMsg& m) {
  std::unique_lock<std::mutex> lock(mu);
  auto it = live.find(m.request_id);
  if (it == live.end()) return;
  std::shared_ptr<Pending> p = it->second;
  if (p->decode_phase && !m.never) {
    // No decode group has room: the KV stays parked on the prefill side meanwhile (P101).
    if (!handoff_queue.empty() && handoff_queue.front() == p->req.id) {
      handoff_retry_in_flight = false;
    } else if (std::find(handoff_queue.begin(), handoff_queue.end(), p->req.id) ==
               handoff_queue.end()) {
      handoff_queue.push_back(p->req.id);
      metrics.count_handoff_deferred();
    }
    return;
  }
  end_prefill(*p);
  const bool was_head = !queue.empty() && queue.front() == p->req.id;
  if (was_head) retry_in_flight = false;
  if (m.never) {
    p->done = true;
    live.erase(it);
    if (was_head) queue.pop_front();
    lock.unlock();
    fail_request(p, api_error(400, m.reason, "invalid_request_error", "context_length_exceeded"),
                 "rejected");
    return;
  }
  if (!p->queued) {
    if (static_cast<int64_t>(queue.size()) >= o.max_queue) {
      p->done = true;
      live.erase(it);
      lock.unlock();
      fail_request(p, queue_full(1), "rejected");
      return;
    }
    p->queued = true;
    queue.push_back(p->req.id);
  }
}

void Gateway::Impl::on_output(const OutputDelta& d) {
  std::unique_lock<std::mutex> lock(mu);
  auto it = live.find(d.request_id);
  if (it == live.end()) return;  // cancelled
  std::shared_ptr<Pending> p = it->second;
  if (p->queued) {  // it was placed after all
    queue.erase(std::remove(queue.begin(), queue.end(), p->req.id), queue.end());
    p->queued = false;
    retry_in_flight = false;
  }
  if (p->decode_phase && !handoff_queue.empty() && handoff_queue.front() == p->req.id) {
    handoff_queue.pop_front();  // a decode group took it
    handoff_retry_in_flight = false;
  }
  end_prefill(*p);
  const int64_t now = now_ns();
  if (!d.token_ids.empty()) {
    if (p->first_token_ns == 0) {
      p->first_token_ns = now;
      metrics.observe_ttft((now - p->arrival_ns) * 1e-9);
    } else {
      metrics.observe_itl((now - p->last_token_ns) * 1e-9);
    }
    p->last_token_ns = now;
  }
  if (!d.error.empty()) {
    p->done = true;
    live.erase(it);
    lock.unlock();
    fail_request(p, server_error(d.error), "error");
    return;
  }
  p->completion_tokens += static_cast<int32_t>(d.token_ids.size());
  if (p->chunks) {
    for (const std::string& event : p->chunks->on_delta(d)) p->stream->send_event(event);
  } else {
    p->whole->add(d);
  }
  if (!d.finish_reason.empty()) p->finished += 1;
  if (p->finished >= p->api.n) {
    finish_pending(p, lock);
  } else if (!d.handoff.link.empty()) {
    // The prefill phase is done: place the decode phase (the prefill side holds the KV).
    p->decode_phase = true;
    p->req.handoff = d.handoff;
    lock.unlock();
    submit(p);
  }
}

void Gateway::Impl::finish_pending(const std::shared_ptr<Pending>& p,
                                   std::unique_lock<std::mutex>& lock) {
  p->done = true;
  live.erase(p->req.id);
  lock.unlock();
  const int64_t now = now_ns();
  metrics.observe_e2e((now - p->arrival_ns) * 1e-9);
  const int32_t out_tokens = p->completion_tokens;
  if (out_tokens > 1 && p->first_token_ns > 0) {
    metrics.observe_tpot((now - p->first_token_ns) * 1e-9 / (out_tokens - 1));
  }
  metrics.count_outcome("success");
  metrics.count_tokens(p->prompt_tokens, out_tokens);
  if (p->chunks) {
    for (const std::string& event : p->chunks->finish()) p->stream->send_event(event);
    p->stream->close();
  } else {
    HttpResponse r;
    r.body = to_json_text(p->api.kind == ApiKind::kChat
                              ? make_chat_response(p->api, p->meta, *p->whole)
                              : make_completion_response(p->api, p->meta, *p->whole));
    p->responder->send(std::move(r));
  }
  idle_cv.notify_all();
}

Result<std::unique_ptr<Gateway>> Gateway::create(const GatewayOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  XDS_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() {
  if (impl_->http) impl_->http->stop(std::chrono::milliseconds(0));
  if (impl_->link) impl_->link->stop();
}

int Gateway::port() const { return impl_->http->port(); }

void Gateway::stop() { impl_->stopping.store(true); }

Status Gateway::run(bool shutdown_instance, int drain_s) {
  Impl& g = *impl_;
  int64_t last_heartbeat_ns = 0;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    for (Impl::InstanceView& v : g.instances) v.last_heard_ns = now_ns();
  }
  // Health probes that nobody answered within 5 s fail with 503.
  while (!g.stopping.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (g.instances.size() > 1) {
      // Heartbeats: an instance silent past --instance-timeout is out (a whole instance killed
      // at once sends no kFailed).
      const int64_t now = now_ns();
      if (now - last_heartbeat_ns >= 1'000'000'000) {
        last_heartbeat_ns = now;
        g.link->post(GatewayLink::kAllInstances, protocol::PingMsg{kHeartbeatId});
      }
      std::vector<int> silent;
      {
        std::lock_guard<std::mutex> lock(g.mu);
        for (size_t i = 0; i < g.instances.size(); ++i) {
          if (g.instances[i].role != "failed" &&
              now - g.instances[i].last_heard_ns > g.o.instance_timeout_s * 1'000'000'000)
            silent.push_back(static_cast<int>(i));
        }
      }
      for (int i : silent) {
        g.on_instance_failed(i, fmt::format("no answer for {} s", g.o.instance_timeout_s));
      }
    }
    std::vector<Responder> stale;
    {
      std::lock_guard<std::mutex> lock(g.mu);
      const int64_t now = now_ns();
      for (auto it = g.probes.begin(); it != g.probes.end();) {
        if (it->second.deadline_ns < now) {
          stale.push_back(it->second.responder);
          it = g.probes.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Responder& r : stale) {
      r.send(make_error_response(
          api_error(503, "a device of the instance does not answer", "server_error", "unhealthy")));
    }
  }
  // Drain: no new requests (handlers answer 503), in-flight ones finish.
  {
    std::unique_lock<std::mutex> lock(g.mu);
    g.idle_cv.wait_for(lock, std::chrono::seconds(drain_s), [&] { return g.live.empty(); });
  }
  g.http->stop(std::chrono::milliseconds(2000));
  if (shutdown_instance) {
    g.link->post(GatewayLink::kAllInstances, protocol::ShutdownMsg{});
  }
  g.link->stop();
  std::lock_guard<std::mutex> lock(g.mu);
  if (!g.failure.empty()) return unavailable("the instance failed: {}", g.failure);
  return {};
}

}  // namespace xds::serve

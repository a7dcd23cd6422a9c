#include "serve/gateway.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/log.h"
#include "protocol/messages.h"
#include "serve/admission_queue.h"
#include "serve/gateway_http.h"
#include "serve/gateway_link.h"
#include "serve/gateway_metrics.h"
#include "serve/instance_router.h"

namespace xds::serve {
namespace {

using engine::OutputDelta;
using protocol::Message;

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
  bool decode_phase = false;  // the prefill instance handed it off (req.handoff)
  int32_t instance = -1;      // where it was last sent
  PrefillTicket prefill;      // counted in an instance's in-flight prefills until a token
  bool done = false;
};

}  // namespace

struct Gateway::Impl : GatewayHttp::Core {
  GatewayOptions o;
  std::unique_ptr<GatewayHttp> http;
  std::unique_ptr<GatewayLink> link;
  GatewayMetrics metrics;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_number{1};

  std::mutex mu;  // guards everything below
  std::condition_variable idle_cv;
  std::mt19937_64 seeds{std::random_device{}()};
  std::unordered_map<std::string, std::shared_ptr<Pending>> live;
  AdmissionQueue admission;
  InstanceRouter router;
  struct Probe {
    Responder responder;
    int64_t deadline_ns = 0;
    int remaining = 1;  // answers still expected (a /health probe asks every instance)
  };
  std::unordered_map<std::string, Probe> probes;  // /health probes and /admin calls in flight
  std::string failure;                            // the instance failed (FailedMsg): why
  std::string eplb_metrics;  // the shell's EPLB lines for /metrics (pushed about once a second)

  explicit Impl(const GatewayOptions& options)
      : o(options),
        admission(options.max_queue),
        router(options.instances.size(),
               InstanceRoutingPolicy{.long_prompt_tokens = options.long_prompt_tokens}) {}

  Status init();
  // GatewayHttp::Core
  bool accepting() const override { return !stopping.load(); }
  std::string next_id(std::string_view prefix) override {
    return fmt::format("{}-{}", prefix, next_number.fetch_add(1));
  }
  uint64_t draw_seed() override {
    std::lock_guard<std::mutex> lock(mu);
    return seeds();
  }
  std::string reply_to() const override { return link->reply_to(); }
  void admit(PreparedRequest r, Responder responder) override;
  void health(Responder responder) override { probe(std::nullopt, std::move(responder)); }
  void admin(protocol::AdminCall call, Responder responder) override {
    probe(call, std::move(responder));
  }
  std::string metrics_text() override;

  void on_message(int from, Message m);
  void on_output(const OutputDelta& d);
  void on_rejected(const protocol::RejectedMsg& m);
  // A FailedMsg from instance `from`. With one instance: every request in flight or queued fails
  // with 503 and the gateway stops. With several: the instance is out; its requests fail,
  // except decode phases that streamed nothing yet, which go to another decode instance.
  void on_instance_failed(int from, const std::string& why);
  // A load report: the handoff queue's head is offered again, else (no handoff waiting) the
  // admission queue's.
  void offer_waiting();
  // Answers p with `err` (its stream gets the error event and closes), counted as `outcome`.
  void fail_request(const std::shared_ptr<Pending>& p, const ApiError& err,
                    const char* outcome = "error");
  void finish_pending(const std::shared_ptr<Pending>& p, std::unique_lock<std::mutex>& lock);
  void submit(const std::shared_ptr<Pending>& p);
  // Sends the shell a probe (a Ping for /health, to every instance; an AdminRequest for an
  // /admin call, to the first) whose answer goes to `resp`; unanswered after 5 s, the run
  // loop's sweep answers 503.
  void probe(std::optional<protocol::AdminCall> admin, Responder resp);
  // Heartbeats to every instance and the silent ones taken out (several instances), then the
  // probes past their deadline answered 503.
  void sweep(int64_t& last_heartbeat_ns);
};

Status Gateway::Impl::init() {
  XDS_ASSIGN_OR_RETURN(http, GatewayHttp::create(o, *this));
  XDS_ASSIGN_OR_RETURN(
      link, GatewayLink::start(o.instances, fmt::format("tcp://{}:0", o.output_host),
                               [this](int from, Message m) { on_message(from, std::move(m)); }));
  return http->start();
}

std::string Gateway::Impl::metrics_text() {
  std::vector<engine::GroupLoad> l;
  {
    std::lock_guard<std::mutex> lock(mu);
    l = router.group_loads();
    if (router.size() > 1) {
      metrics.set_instances_state(router.handoffs().size(), router.cached_blocks());
    }
  }
  std::string body = metrics.render(l);
  {
    std::lock_guard<std::mutex> lock(mu);
    body += eplb_metrics;
  }
  return body;
}

void Gateway::Impl::probe(std::optional<protocol::AdminCall> admin, Responder resp) {
  const std::string id = next_id(admin ? "admin" : "health");
  // /health asks every instance; /admin calls go to the first.
  const bool all = !admin;
  {
    std::lock_guard<std::mutex> lock(mu);
    probes.emplace(id, Probe{resp, now_ns() + int64_t{5'000'000'000},
                             all ? static_cast<int>(router.size()) : 1});
  }
  Message m;
  if (admin) {
    m = protocol::AdminRequestMsg{id, *admin};
  } else {
    m = protocol::PingMsg{id};
  }
  link->post(all ? GatewayLink::kAllInstances : 0, std::move(m));
}

void Gateway::Impl::admit(PreparedRequest r, Responder responder) {
  auto p = std::make_shared<Pending>();
  p->api = std::move(r.api);
  p->req = std::move(r.req);
  p->meta = std::move(r.meta);
  p->prompt_tokens = r.prompt_tokens;
  p->arrival_ns = r.arrival_ns;
  if (p->api.stream) {
    p->chunks.emplace(p->api, p->meta);
  } else {
    p->whole.emplace(p->api.n);
  }
  p->responder = responder;

  {
    std::lock_guard<std::mutex> lock(mu);
    if (!admission.accepts_new()) {
      responder.send(make_error_response(queue_full(1)));
      metrics.count_outcome("rejected");
      return;
    }
    live[p->req.id] = p;
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
    router.end_prefill(p->prefill);
    live.erase(p->req.id);
    admission.cancel(p->req.id);
    router.handoffs().cancel(p->req.id);
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

void Gateway::Impl::submit(const std::shared_ptr<Pending>& p) {
  protocol::RequestMsg m;
  int to = 0;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (router.size() > 1) {
      const InstanceRoute route = router.route(p->req.prompt, p->decode_phase);
      if (route.no_decode) {
        p->done = true;
        live.erase(p->req.id);
        lock.unlock();
        fail_request(p, api_error(503, "no decode instance is left to continue this request",
                                  "server_error", "instance_failed"));
        idle_cv.notify_all();
        return;
      }
      // Backpressure from the decode side: no new prefill work while handoffs wait.
      if (route.hold && admission.hold(p->req.id)) return;
      to = route.to;
      p->req.phase = route.phase;
      if (!p->decode_phase) {
        router.count_prefill(p->prefill, to, static_cast<int64_t>(p->req.prompt.size()));
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
    router.heard(from, now_ns());
    const auto* load = std::get_if<protocol::LoadMsg>(&m);
    const auto* pong = std::get_if<protocol::PongMsg>(&m);
    if (load || pong) router.report_role(from, load ? load->role : pong->role);
    if (pong && pong->probe_id == kHeartbeatId) return;
  }
  if (const auto* blocks = std::get_if<protocol::BlocksMsg>(&m)) {
    if (from < 0) return;
    std::lock_guard<std::mutex> lock(mu);
    router.update_blocks(from, blocks->added, blocks->removed);
  } else if (const auto* out = std::get_if<protocol::OutputMsg>(&m)) {
    for (const OutputDelta& d : out->outputs) on_output(d);
  } else if (const auto* rej = std::get_if<protocol::RejectedMsg>(&m)) {
    on_rejected(*rej);
  } else if (const auto* failed = std::get_if<protocol::FailedMsg>(&m)) {
    on_instance_failed(from, failed->reason);
  } else if (auto* load = std::get_if<protocol::LoadMsg>(&m)) {
    if (from < 0) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      router.update_loads(from, std::move(load->loads));
    }
    offer_waiting();
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

void Gateway::Impl::offer_waiting() {
  std::shared_ptr<Pending> head;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto alive = [&](const std::string& id) { return live.count(id) > 0; };
    if (auto id = router.handoffs().offer(alive)) {
      head = live.at(*id);
    } else if (router.handoffs().empty()) {
      if (auto queued = admission.offer(alive)) head = live.at(*queued);
    }
  }
  if (head) submit(head);
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
  if (router.size() > 1 && from >= 0) {
    std::vector<std::shared_ptr<Pending>> failed, replaced;
    bool any_left = false, reoffer = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      XDS_LOG_ERROR("gateway: instance {} ({}) failed: {}", o.instances[static_cast<size_t>(from)],
                    instance_state_name(router.state(from)), why);
      any_left = router.mark_failed(from);
      // The waiting head offered to this instance gets no answer: it is offered again.
      if (const std::string* head = admission.head(); head && admission.offer_in_flight()) {
        auto it = live.find(*head);
        if (it != live.end() && it->second->instance == from) {
          admission.offer_lost();
          reoffer = true;
        }
      }
      for (auto it = live.begin(); it != live.end();) {
        const std::shared_ptr<Pending>& p = it->second;
        if (p->instance != from || admission.contains(it->first)) {
          ++it;
          continue;
        }
        const bool streamed =
            p->completion_tokens != static_cast<int32_t>(p->req.handoff.output.size());
        if (router.continues_elsewhere(p->decode_phase, streamed)) {
          replaced.push_back(p);
          ++it;
          continue;
        }
        p->done = true;
        router.end_prefill(p->prefill);
        failed.push_back(p);
        router.handoffs().cancel(it->first);
        it = live.erase(it);
      }
    }
    const ApiError err = api_error(503,
                                   fmt::format("the instance serving this request ({}) failed: {}",
                                               o.instances[static_cast<size_t>(from)], why),
                                   "server_error", "instance_failed");
    for (const std::shared_ptr<Pending>& p : failed) fail_request(p, err);
    for (const std::shared_ptr<Pending>& p : replaced) submit(p);
    if (reoffer && any_left) offer_waiting();
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
    admission.clear();
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
    if (router.handoffs().defer(p->req.id)) metrics.count_handoff_deferred();
    return;
  }
  router.end_prefill(p->prefill);
  if (m.never) {
    p->done = true;
    live.erase(it);
    admission.refuse(p->req.id);
    lock.unlock();
    fail_request(p, api_error(400, m.reason, "invalid_request_error", "context_length_exceeded"),
                 "rejected");
    return;
  }
  if (admission.defer(p->req.id) == AdmissionQueue::Deferral::kFull) {
    p->done = true;
    live.erase(it);
    lock.unlock();
    fail_request(p, queue_full(1), "rejected");
  }
}

void Gateway::Impl::on_output(const OutputDelta& d) {
  std::unique_lock<std::mutex> lock(mu);
  auto it = live.find(d.request_id);
  if (it == live.end()) return;  // cancelled
  std::shared_ptr<Pending> p = it->second;
  admission.placed(p->req.id);                              // it was placed after all
  if (p->decode_phase) router.handoffs().taken(p->req.id);  // a decode group took it
  router.end_prefill(p->prefill);
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

void Gateway::Impl::sweep(int64_t& last_heartbeat_ns) {
  {
    // Heartbeats: an instance silent past --instance-timeout since it last answered is out (a
    // whole instance killed at once, or its shell, sends no FailedMsg). With one instance its
    // requests fail and the gateway stops instead of waiting forever.
    const int64_t now = now_ns();
    if (now - last_heartbeat_ns >= 1'000'000'000) {
      last_heartbeat_ns = now;
      link->post(GatewayLink::kAllInstances, protocol::PingMsg{kHeartbeatId});
    }
    std::vector<int32_t> silent;
    {
      std::lock_guard<std::mutex> lock(mu);
      silent = router.silent(now, o.instance_timeout_s * 1'000'000'000);
    }
    for (int32_t i : silent) {
      on_instance_failed(i, fmt::format("no answer for {} s", o.instance_timeout_s));
    }
  }
  // Health probes that nobody answered within 5 s fail with 503.
  std::vector<Responder> stale;
  {
    std::lock_guard<std::mutex> lock(mu);
    const int64_t now = now_ns();
    for (auto it = probes.begin(); it != probes.end();) {
      if (it->second.deadline_ns < now) {
        stale.push_back(it->second.responder);
        it = probes.erase(it);
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

Result<std::unique_ptr<Gateway>> Gateway::create(const GatewayOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  XDS_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() {
  if (impl_->http) impl_->http->stop(std::chrono::milliseconds(0));
  if (impl_->link) impl_->link->stop();
}

int Gateway::port() const {
  return impl_->http->port();
}

void Gateway::stop() {
  impl_->stopping.store(true);
}

Status Gateway::run(bool shutdown_instance, int drain_s) {
  Impl& g = *impl_;
  int64_t last_heartbeat_ns = 0;
  while (!g.stopping.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    g.sweep(last_heartbeat_ns);
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

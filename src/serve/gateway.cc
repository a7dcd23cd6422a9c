#include "serve/gateway.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/log.h"
#include "protocol/messages.h"
#include "serve/admission_queue.h"
#include "serve/fault_injection.h"
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
  uint64_t incarnation = 0;   // that instance's incarnation when it was sent
  int32_t prefill_instance = -1;  // the instance that handed it off (decode phase)
  PrefillTicket prefill;      // counted in an instance's in-flight prefills until a token
  bool done = false;
  // Token recomputation: the ids each choice streamed, and which choices ended; a request whose
  // instance fails is sent again with them (EngineRequest::resume).
  std::vector<std::vector<int32_t>> streamed;  // [n]
  std::vector<int32_t> choice_done;            // [n]
  bool orphaned = false;  // its instance failed; it waits to be sent again
  int64_t lost_ns = 0;    // > 0: when its instance failed, until its next token

  bool streamed_any() const {
    for (const auto& s : streamed) {
      if (!s.empty()) return true;
    }
    return false;
  }
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
    bool health = false;
  };
  std::unordered_map<std::string, Probe> probes;  // /health probes and /admin calls in flight
  std::string failure;  // serving stopped for good (serve's instance processes exited): why
  // Requests whose instance failed, waiting to be sent again (oldest first); recomputed from
  // what they streamed (Pending::streamed) on whichever instance serves first.
  std::deque<std::string> orphans;
  int64_t unavailable_since_ns = 0;  // > 0: no instance has served since then
  FaultLog faults;
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
  void inject_fault(protocol::FaultSpec fault, Responder responder) override;
  void list_faults(Responder responder) override;
  std::string metrics_text() override;

  void on_message(int from, Message m);
  void on_output(const OutputDelta& d);
  void on_rejected(const protocol::RejectedMsg& m);
  // Instance `from` failed (its FailedMsg, or heartbeat silence): it is out until it answers
  // again, ready; its requests are orphans, sent again to whatever instance serves (at once
  // where another does, else when it is back).
  void on_instance_failed(int from, const std::string& why, bool recovering,
                          const std::string& kind);
  // Its shell answered (a load or a heartbeat pong): a new incarnation orphans what the old
  // one held; a ready answer brings an instance that was out back.
  void on_instance_answer(int from, uint64_t incarnation, bool ready,
                          protocol::InstanceRole role);
  // Under mu: the live requests sent to `from` (to an incarnation other than `keep`, when
  // given) become orphans.
  void orphan_requests_of(int from, int64_t now, std::optional<uint64_t> keep = std::nullopt);
  // Sends the orphans again, oldest first, while an instance serves.
  void resend_orphans();
  // Fails what waits (orphans, the admission queue) once no instance has served for
  // recovery_timeout_s, and orphans older than that.
  void expire_waiting(int64_t now);
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
  // Under mu: /health's 503 while an instance is out (which, and why); none while all serve.
  std::optional<HttpResponse> unavailable_health() const;
  // Under mu: the orphans and the admission queue leave `live`; the caller fails them.
  std::vector<std::shared_ptr<Pending>> take_waiting();
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

std::optional<HttpResponse> Gateway::Impl::unavailable_health() const {
  nlohmann::json out = nlohmann::json::array();
  bool all = true;
  for (size_t i = 0; i < router.size(); ++i) {
    const auto k = static_cast<int32_t>(i);
    all = all && router.serving(k);
    out.push_back({{"instance", o.instances[i]},
                   {"state", router.serving(k) ? "serving" : instance_state_name(router.state(k))},
                   {"why", router.why(k)}});
  }
  if (all) return std::nullopt;
  HttpResponse r;
  r.status = 503;
  r.body = nlohmann::json{{"status", "unavailable"}, {"instances", out}}.dump();
  return r;
}

void Gateway::Impl::probe(std::optional<protocol::AdminCall> admin, Responder resp) {
  if (!admin) {
    std::optional<HttpResponse> out;
    {
      std::lock_guard<std::mutex> lock(mu);
      out = unavailable_health();
    }
    if (out) {
      resp.send(std::move(*out));
      return;
    }
  }
  const std::string id = next_id(admin ? "admin" : "health");
  // /health asks every instance; /admin calls go to the first.
  const bool all = !admin;
  {
    std::lock_guard<std::mutex> lock(mu);
    probes.emplace(id, Probe{resp, now_ns() + int64_t{5'000'000'000},
                             all ? static_cast<int>(router.size()) : 1, /*health=*/!admin});
  }
  Message m;
  if (admin) {
    m = protocol::AdminRequestMsg{id, *admin, {}};
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
  p->streamed.resize(static_cast<size_t>(std::max(1, p->api.n)));
  p->choice_done.assign(p->streamed.size(), 0);

  {
    std::lock_guard<std::mutex> lock(mu);
    if (unavailable_since_ns > 0 &&
        now_ns() - unavailable_since_ns > o.recovery_timeout_s * 1'000'000'000) {
      responder.send(make_error_response(
          api_error(503, "no instance is serving (it failed and has not recovered)",
                    "server_error", "instance_failed")));
      metrics.count_outcome("rejected");
      return;
    }
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
    orphans.erase(std::remove(orphans.begin(), orphans.end(), p->req.id), orphans.end());
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
    if (p->done) return;
    const bool resend = p->orphaned;
    const bool streamed = p->streamed_any();
    if (resend && p->decode_phase) {
      // A decode phase continues from the prefill side's KV only while that instance holds
      // it and nothing streamed since the handoff; otherwise it is recomputed whole.
      size_t since = 0;
      for (const auto& t : p->streamed) since += t.size();
      const bool kv_held = p->prefill_instance >= 0 && router.serving(p->prefill_instance);
      if (!kv_held || since != p->req.handoff.output.size()) {
        p->decode_phase = false;
        p->req.handoff = {};
      }
    }
    // Recomputed on a decode (or colocated) instance when it streamed already: the prefill
    // side would only repeat what the client has.
    InstanceRoute route = router.route(p->req.prompt, p->decode_phase || streamed);
    if (route.no_decode) {
      // No decode instance serves now: recomputed whole wherever one serves (the prefill
      // side's parked KV expires there).
      p->decode_phase = false;
      p->req.handoff = {};
      route = router.route(p->req.prompt, false);
    }
    if (route.to < 0) {  // no instance serves now: wait for one
      if (resend) {
        if (std::find(orphans.begin(), orphans.end(), p->req.id) == orphans.end())
          orphans.push_back(p->req.id);
      } else {
        admission.hold(p->req.id);
      }
      return;
    }
    // Backpressure from the decode side: no new prefill work while handoffs wait.
    if (route.hold && !resend && admission.hold(p->req.id)) return;
    to = route.to;
    p->req.phase = (streamed && !p->decode_phase) ? engine::RequestPhase::kWhole : route.phase;
    if (!p->decode_phase && router.size() > 1) {
      router.count_prefill(p->prefill, to, static_cast<int64_t>(p->req.prompt.size()));
    }
    if (p->decode_phase || !streamed) {
      p->req.resume.clear();
      p->req.resume_finished.clear();
    } else {
      p->req.resume = p->streamed;
      p->req.resume_finished = p->choice_done;
    }
    if (resend) metrics.count_recomputed();
    p->orphaned = false;
    p->instance = to;
    p->incarnation = router.incarnation(to);
    m.request = p->req;
    m.incarnation = p->incarnation;
  }
  link->post(to, std::move(m));
}

void Gateway::Impl::orphan_requests_of(int from, int64_t now, std::optional<uint64_t> keep) {
  for (auto& [id, p] : live) {
    if (p->done || p->orphaned || admission.contains(id)) continue;
    const bool held_there = p->instance == from && (!keep || p->incarnation != *keep);
    // A decode phase waiting for a decode instance loses its KV with its prefill instance.
    const bool kv_there = p->decode_phase && p->prefill_instance == from && !keep;
    if (!held_there && !kv_there) continue;
    p->orphaned = true;
    if (p->lost_ns == 0) p->lost_ns = now;
    p->req.attempt += 1;  // what the lost attempt still sends is dropped
    router.end_prefill(p->prefill);
    router.handoffs().cancel(id);
    orphans.push_back(id);
  }
}

void Gateway::Impl::resend_orphans() {
  std::vector<std::shared_ptr<Pending>> again;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!router.any_serving()) return;
    for (const std::string& id : orphans) {
      auto it = live.find(id);
      if (it != live.end() && !it->second->done) again.push_back(it->second);
    }
    orphans.clear();
  }
  for (const std::shared_ptr<Pending>& p : again) submit(p);
}

void Gateway::Impl::expire_waiting(int64_t now) {
  const int64_t limit = o.recovery_timeout_s * 1'000'000'000;
  std::vector<std::shared_ptr<Pending>> expired;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (router.any_serving()) {
      unavailable_since_ns = 0;
    } else if (unavailable_since_ns == 0) {
      unavailable_since_ns = now;
    }
    const bool none_for_long = unavailable_since_ns > 0 && now - unavailable_since_ns > limit;
    for (auto it = orphans.begin(); it != orphans.end();) {
      auto p = live.find(*it);
      if (p == live.end() || p->second->done) {
        it = orphans.erase(it);
      } else if (none_for_long || now - p->second->lost_ns > limit) {
        expired.push_back(p->second);
        it = orphans.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::shared_ptr<Pending>& p : expired) {
      p->done = true;
      router.end_prefill(p->prefill);
      live.erase(p->req.id);
    }
    if (none_for_long) {
      std::vector<std::shared_ptr<Pending>> rest = take_waiting();
      expired.insert(expired.end(), rest.begin(), rest.end());
    }
  }
  const ApiError err = api_error(
      503, fmt::format("no instance could serve this request within {} s of a failure",
                       o.recovery_timeout_s),
      "server_error", "instance_failed");
  for (const std::shared_ptr<Pending>& p : expired) fail_request(p, err);
  if (!expired.empty()) idle_cv.notify_all();
}

void Gateway::Impl::on_instance_answer(int from, uint64_t incarnation, bool ready,
                                       protocol::InstanceRole role) {
  bool again = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    const int64_t now = now_ns();
    if (incarnation != 0 && router.restarted(from, incarnation)) {
      XDS_LOG_WARN("gateway: instance {} restarted (a new incarnation): the requests it held "
                   "are recomputed",
                   o.instances[static_cast<size_t>(from)]);
      metrics.count_instance_restart(from);
      faults.observe(from, "restarted", now);
      orphan_requests_of(from, now, incarnation);
      again = true;
    }
    if (ready && router.rejoin(from, role)) {
      XDS_LOG_WARN("gateway: instance {} serves again", o.instances[static_cast<size_t>(from)]);
      metrics.set_instance_up(from, true);
      faults.observe(from, "serving again", now);
      again = true;
    }
    if (ready) router.report_role(from, role);
  }
  if (again) resend_orphans();
}

void Gateway::Impl::on_message(int from, Message m) {
  if (from >= 0) {
    {
      std::lock_guard<std::mutex> lock(mu);
      router.heard(from, now_ns());
    }
    const auto* load = std::get_if<protocol::LoadMsg>(&m);
    const auto* pong = std::get_if<protocol::PongMsg>(&m);
    if (load) on_instance_answer(from, load->incarnation, /*ready=*/true, load->role);
    if (pong) on_instance_answer(from, pong->incarnation, pong->ready, pong->role);
    if (pong && pong->probe_id == kHeartbeatId) {
      offer_waiting();
      return;
    }
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
    if (from >= 0) {
      on_instance_failed(from, failed->reason, failed->recovering,
                         failed->recovering ? failed->kind : "final");
    }
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

void Gateway::Impl::on_instance_failed(int from, const std::string& why, bool recovering,
                                      const std::string& kind) {
  bool reoffer = false;
  std::vector<std::pair<Responder, HttpResponse>> answered;
  std::vector<std::shared_ptr<Pending>> given_up;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!router.serving(from)) return;  // out already
    const int64_t now = now_ns();
    XDS_LOG_ERROR("gateway: instance {} ({}) failed{}: {}", o.instances[static_cast<size_t>(from)],
                  instance_state_name(router.state(from)), recovering ? ", it restarts" : "",
                  why);
    metrics.count_instance_failure(from, kind);
    metrics.set_instance_up(from, false);
    faults.observe(from, fmt::format("failed ({}): {}", kind, why), now);
    router.mark_failed(from, recovering, why);
    // The waiting head offered to this instance gets no answer: it is offered again.
    if (const std::string* head = admission.head(); head && admission.offer_in_flight()) {
      auto it = live.find(*head);
      if (it != live.end() && it->second->instance == from) {
        admission.offer_lost();
        reoffer = true;
      }
    }
    orphan_requests_of(from, now);
    // /health probes waiting on the instance's groups learn at once.
    if (std::optional<HttpResponse> health = unavailable_health()) {
      for (auto it = probes.begin(); it != probes.end();) {
        if (it->second.health) {
          answered.emplace_back(it->second.responder, *health);
          it = probes.erase(it);
        } else {
          ++it;
        }
      }
    }
    // It will not restart and nothing else serves: what waits would wait in vain.
    if (!recovering && !router.any_serving()) given_up = take_waiting();
  }
  for (auto& [responder, response] : answered) responder.send(std::move(response));
  const ApiError err = api_error(
      503, fmt::format("the instance serving this request ({}) failed: {}",
                       o.instances[static_cast<size_t>(from)], why),
      "server_error", "instance_failed");
  for (const std::shared_ptr<Pending>& p : given_up) fail_request(p, err);
  resend_orphans();
  if (reoffer) offer_waiting();
  idle_cv.notify_all();
}

std::vector<std::shared_ptr<Pending>> Gateway::Impl::take_waiting() {
  std::vector<std::shared_ptr<Pending>> out;
  for (const std::string& id : orphans) {
    auto it = live.find(id);
    if (it != live.end()) out.push_back(it->second);
  }
  orphans.clear();
  while (const std::string* head = admission.head()) {
    auto it = live.find(*head);
    if (it != live.end()) out.push_back(it->second);
    admission.cancel(*head);
  }
  for (const std::shared_ptr<Pending>& p : out) {
    p->done = true;
    router.end_prefill(p->prefill);
    live.erase(p->req.id);
  }
  return out;
}

void Gateway::Impl::on_rejected(const protocol::RejectedMsg& m) {
  std::unique_lock<std::mutex> lock(mu);
  auto it = live.find(m.request_id);
  if (it == live.end()) return;
  std::shared_ptr<Pending> p = it->second;
  if (m.attempt != p->req.attempt || p->orphaned) return;  // about an attempt given up
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
  // A delta of an attempt given up (its instance failed) is never streamed: the request was
  // sent again and continues from what the client has.
  if (d.attempt != p->req.attempt || p->orphaned) return;
  admission.placed(p->req.id);                              // it was placed after all
  if (p->decode_phase) router.handoffs().taken(p->req.id);  // a decode group took it
  router.end_prefill(p->prefill);
  const int64_t now = now_ns();
  if (!d.token_ids.empty() && p->lost_ns > 0) {  // the first token after its instance failed
    metrics.observe_fault_recovery((now - p->lost_ns) * 1e-9);
    p->lost_ns = 0;
  }
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
  if (d.index >= 0 && static_cast<size_t>(d.index) < p->streamed.size()) {
    auto& ids = p->streamed[static_cast<size_t>(d.index)];
    ids.insert(ids.end(), d.token_ids.begin(), d.token_ids.end());
    if (!d.finish_reason.empty()) p->choice_done[static_cast<size_t>(d.index)] = 1;
  }
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
    p->prefill_instance = p->instance;
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
    // Heartbeats, answered by each shell's own loop: an instance silent past
    // --instance-timeout since it last answered is out (a whole instance killed at once, or its
    // shell, sends no FailedMsg); its requests wait for it, or for another, to serve them.
    const int64_t now = now_ns();
    if (now - last_heartbeat_ns >= o.instance_heartbeat_ms * 1'000'000) {
      last_heartbeat_ns = now;
      link->post(GatewayLink::kAllInstances, protocol::PingMsg{kHeartbeatId});
    }
    std::vector<int32_t> silent;
    {
      std::lock_guard<std::mutex> lock(mu);
      silent = router.silent(now, o.instance_timeout_s * 1'000'000'000);
    }
    for (int32_t i : silent) {
      on_instance_failed(i, fmt::format("no answer to the heartbeat for {} s", o.instance_timeout_s),
                         /*recovering=*/true, "silent");
    }
    expire_waiting(now);
    if (o.instances_exited) {
      if (std::string gone = o.instances_exited(); !gone.empty()) {
        std::vector<std::shared_ptr<Pending>> cut;
        {
          std::lock_guard<std::mutex> lock(mu);
          failure = gone;
          for (auto& [id, p] : live) {
            p->done = true;
            cut.push_back(p);
          }
          live.clear();
          orphans.clear();
          admission.clear();
        }
        stopping.store(true);
        const ApiError err = api_error(503, "the instance failed: " + gone, "server_error",
                                       "instance_failed");
        for (const std::shared_ptr<Pending>& p : cut) fail_request(p, err);
        idle_cv.notify_all();
      }
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
  if (!g.failure.empty()) return unavailable("{}", g.failure);
  return {};
}

void Gateway::Impl::inject_fault(protocol::FaultSpec fault, Responder responder) {
  const std::string id = next_id("fault");
  {
    std::lock_guard<std::mutex> lock(mu);
    fault.id = next_number.fetch_add(1);
    probes.emplace(id, Probe{responder, now_ns() + int64_t{5'000'000'000}, 1, false});
    faults.accepted(fault, now_ns());
  }
  protocol::AdminRequestMsg m{id, protocol::AdminCall::kInjectFault, nlohmann::json(fault).dump()};
  link->post(fault.instance, std::move(m));
}

void Gateway::Impl::list_faults(Responder responder) {
  HttpResponse r;
  {
    std::lock_guard<std::mutex> lock(mu);
    r.body = faults.to_json().dump();
  }
  responder.send(std::move(r));
}

}  // namespace xds::serve

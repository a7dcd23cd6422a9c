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
#include "serve/gateway_impl.h"

namespace xds::serve {

Status Gateway::Impl::init() {
  XDS_ASSIGN_OR_RETURN(http, GatewayHttp::create(o, *this));
  if (!o.etcd.empty() && !o.instances.empty()) {
    return invalid_argument(
        "gateway: --etcd and --instances exclude each other (with --etcd the "
        "instances are those registered in etcd)");
  }
  XDS_ASSIGN_OR_RETURN(link, GatewayLink::start(
                                 o.instances, fmt::format("tcp://{}:0", o.output_host),
                                 [this](int from, Message m) { on_message(from, std::move(m)); },
                                 /*may_start_empty=*/!o.etcd.empty()));
  if (!o.etcd.empty()) {
    // The first read happens here: the instances registered now are connected before the
    // HTTP server accepts anything.
    XDS_ASSIGN_OR_RETURN(etcd, EtcdMembershipWatch::start(
                                   {o.etcd, o.etcd_prefix},
                                   [this](const etcd::MemberChange& c) { on_etcd_change(c); }));
  }
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
  // /health asks every instance (but those that left etcd); /admin calls go to the first.
  const bool all = !admin;
  int first = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    int asked = 0;
    for (size_t i = router.size(); i-- > 0;) {
      if (router.state(static_cast<int32_t>(i)) == InstanceState::kLeft) continue;
      ++asked;
      first = static_cast<int>(i);
    }
    probes.emplace(id, Probe{resp, now_ns() + int64_t{5'000'000'000}, all ? asked : 1,
                             /*health=*/!admin});
  }
  Message m;
  if (admin) {
    m = protocol::AdminRequestMsg{id, *admin, {}};
  } else {
    m = protocol::PingMsg{id};
  }
  link->post(all ? GatewayLink::kAllInstances : first, std::move(m));
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
    if (no_instance_registered()) {
      responder.send(make_error_response(no_instance_error()));
      metrics.count_outcome("rejected");
      return;
    }
    if (unavailable_since_ns > 0 &&
        now_ns() - unavailable_since_ns > o.recovery_timeout_s * 1'000'000'000) {
      const ApiError err =
          api_error(503, "no instance is serving (it failed and has not recovered)", "server_error",
                    "instance_failed");
      responder.send(make_error_response(err));
      metrics.count_rejected(rejection_reason(err));
      return;
    }
    if (!admission.accepts_new()) {
      const ApiError err = queue_full(1);
      responder.send(make_error_response(err));
      metrics.count_rejected(rejection_reason(err));
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
  } else if (const auto* members = std::get_if<protocol::MembershipMsg>(&m)) {
    if (from >= 0) on_membership(from, *members);
  } else if (const auto* failed = std::get_if<protocol::FailedMsg>(&m)) {
    if (from >= 0) {
      on_instance_failed(from, failed->reason, failed->recovering,
                         failed->recovering ? failed->kind : "final");
    }
  } else if (auto* load = std::get_if<protocol::LoadMsg>(&m)) {
    if (from < 0) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const engine::GroupLoad& l : load->loads) {
        int64_t& seen = rollbacks_seen[{from, l.group}];
        if (l.rollbacks > seen) {
          faults.observe(from, fmt::format("DP group {} rolled a step back ({} so far)", l.group,
                                           l.rollbacks),
                         now_ns());
        }
        seen = l.rollbacks;
      }
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
  if (std::string_view(outcome) == "rejected") {
    metrics.count_rejected(rejection_reason(err));
  } else {
    metrics.count_outcome(outcome);
  }
  if (p->stream) {
    p->stream->send_event(to_json_text(make_error(err)));
    p->stream->close();
  } else {
    p->responder->send(make_error_response(err));
  }
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
  if (impl_->etcd) impl_->etcd->stop();
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
  if (g.etcd) g.etcd->stop();
  if (shutdown_instance) {
    g.link->post(GatewayLink::kAllInstances, protocol::ShutdownMsg{});
  }
  g.link->stop();
  std::lock_guard<std::mutex> lock(g.mu);
  if (!g.failure.empty()) return unavailable("{}", g.failure);
  return {};
}

}  // namespace xds::serve

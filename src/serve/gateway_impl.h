// The gateway's state and its parts' wiring (serve/gateway.h), shared by gateway.cc (the
// request path: admission, placement, outputs, the run loop) and gateway_recovery.cc (instance
// failures and restarts, orphans sent again, /health while an instance is out, faults).
//
// Thread-safety: see gateway.h; everything below `mu` is guarded by it.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "protocol/messages.h"
#include "serve/admission_queue.h"
#include "serve/etcd_watch.h"
#include "serve/fault_injection.h"
#include "serve/gateway.h"
#include "serve/gateway_http.h"
#include "serve/gateway_link.h"
#include "serve/gateway_metrics.h"
#include "serve/instance_router.h"

namespace xds::serve {

using engine::OutputDelta;
using protocol::Message;

// The request id of the gateway's heartbeat pings (their pongs only mark the instance alive).
inline constexpr const char* kHeartbeatId = "heartbeat";

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

struct Gateway::Impl : GatewayHttp::Core {
  GatewayOptions o;
  std::unique_ptr<GatewayHttp> http;
  std::unique_ptr<GatewayLink> link;
  std::unique_ptr<EtcdMembershipWatch> etcd;  // with --etcd: adds and drops instances
  GatewayMetrics metrics;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_number{1};

  std::mutex mu;  // guards everything below
  std::condition_variable idle_cv;
  std::mt19937_64 seeds{std::random_device{}()};
  std::unordered_map<std::string, std::shared_ptr<Pending>> live;
  AdmissionQueue admission;
  InstanceRouter router;
  std::vector<std::string> addresses;             // [router.size()] each instance's shell address
  std::map<std::string, int32_t> etcd_instances;  // etcd key -> the instance registered there
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
  // (instance, group) -> the step rollbacks that group last reported (a rise is logged as an
  // outcome of the instance's faults).
  std::map<std::pair<int32_t, int32_t>, int64_t> rollbacks_seen;
  std::string eplb_metrics;  // the shell's EPLB lines for /metrics (pushed about once a second)

  explicit Impl(const GatewayOptions& options)
      : o(options),
        admission(options.max_queue),
        router(options.instances.size(),
               InstanceRoutingPolicy{.long_prompt_tokens = options.long_prompt_tokens}),
        addresses(options.instances) {}

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
  void count_rejected(const ApiError& e) override { metrics.count_rejected(rejection_reason(e)); }

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
  // Instance `from` lost a DP group and goes on without it: the requests that group held are
  // orphans, sent again at once (recomputed from what they streamed). Or the group joined
  // again.
  void on_membership(int from, const protocol::MembershipMsg& m);
  // Membership in etcd (gateway_etcd.cc): an instance registered (a new index, connected at
  // once), or its entry went (it leaves for good: its requests go elsewhere, or fail with 503
  // when no instance is left).
  void on_etcd_change(const etcd::MemberChange& change);
  void on_instance_left(int from, const std::string& why);
  // Under mu: the 503 for requests that arrive while no instance is registered (etcd).
  bool no_instance_registered() const { return !o.etcd.empty() && !router.any_present(); }
  ApiError no_instance_error() const;
  // Under mu: the live requests sent to `from` (to an incarnation other than `keep`, when
  // given) become orphans.
  void orphan_requests_of(int from, int64_t now, std::optional<uint64_t> keep = std::nullopt);
  // Under mu: request `id` lost its KV at `now`: an orphan, sent again as the next attempt.
  void orphan(const std::string& id, Pending& p, int64_t now);
  // Sends the orphans again, oldest first, while an instance serves.
  void resend_orphans();
  // Fails what waits (orphans, the admission queue) once no instance has served for
  // recovery_timeout_s, and orphans older than that.
  void expire_waiting(int64_t now);
  // A load report: the handoff queue's head is offered again, else (no handoff waiting) the
  // admission queue's.
  void offer_waiting();
  // Answers p with `err` (its stream gets the error event and closes), counted as `outcome`
  // ("rejected": by its reason, GatewayMetrics::count_rejected).
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

}  // namespace xds::serve

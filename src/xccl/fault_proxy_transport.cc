#include "xccl/fault_proxy_transport.h"

#include <chrono>
#include <thread>

namespace xds::xccl {

std::string_view fault_op_name(FaultOp op) {
  switch (op) {
    case FaultOp::kPut:
      return "put";
    case FaultOp::kGet:
      return "get";
    case FaultOp::kPutWithSignal:
      return "put_with_signal";
    case FaultOp::kTestSignal:
      return "test_signal";
    case FaultOp::kFlush:
      return "flush";
  }
  return "unknown";
}

FaultProxyTransport::FaultProxyTransport(std::unique_ptr<Transport> inner)
    : inner_(std::move(inner)) {
  XDS_CHECK(inner_ != nullptr, "FaultProxyTransport: no transport to wrap");
}

Result<size_t> FaultProxyTransport::add_rule(const FaultRule& rule) {
  if (rule.nth == 0 || rule.count == 0 || rule.peer < kAnyPeer || rule.delay_ns < 0)
    return invalid_argument(
        "fault rule for {}: nth {} and count {} must be >= 1, peer {} >= {}, "
        "delay {} ns >= 0",
        fault_op_name(rule.op), rule.nth, rule.count, rule.peer, kAnyPeer, rule.delay_ns);
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(rule);
  stats_.emplace_back();
  return rules_.size() - 1;
}

void FaultProxyTransport::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
  stats_.clear();
}

FaultRuleStats FaultProxyTransport::stats(size_t rule) const {
  std::lock_guard<std::mutex> lock(mu_);
  XDS_CHECK(rule < stats_.size(), "fault rule {} of {}", rule, stats_.size());
  return stats_[rule];
}

FaultProxyTransport::Decision FaultProxyTransport::decide(FaultOp op, int peer) {
  Decision d;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < rules_.size(); ++i) {
    const FaultRule& r = rules_[i];
    if (r.op != op || (r.peer != kAnyPeer && r.peer != peer)) continue;
    FaultRuleStats& s = stats_[i];
    const uint64_t k = ++s.matched;  // this operation is the rule's kth
    const bool takes = k >= r.nth && (r.count == kForever || k - r.nth < r.count);
    if (!takes || d.act) continue;
    ++s.fired;
    d = Decision{true, r.action, r.delay_ns};
  }
  return d;
}

bool FaultProxyTransport::skip(const Decision& d) {
  if (!d.act) return false;
  if (d.action == FaultAction::kDelay) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(d.delay_ns));
    return false;
  }
  return true;
}

namespace {
OpState skipped_state(FaultAction a) {
  return a == FaultAction::kFail ? OpState::kFailed : OpState::kDone;
}
}  // namespace

OpState FaultProxyTransport::put(const MemDesc& dst, uint64_t off, const void* src, uint64_t n) {
  const Decision d = decide(FaultOp::kPut, dst.rank);
  if (skip(d)) return skipped_state(d.action);
  return inner_->put(dst, off, src, n);
}

OpState FaultProxyTransport::get(void* dst, const MemDesc& src, uint64_t off, uint64_t n) {
  const Decision d = decide(FaultOp::kGet, src.rank);
  if (skip(d)) return skipped_state(d.action);
  return inner_->get(dst, src, off, n);
}

OpState FaultProxyTransport::put_with_signal(const MemDesc& dst, uint64_t off, const void* src,
                                             uint64_t n, const SignalRef& sig, uint64_t value) {
  const Decision d = decide(FaultOp::kPutWithSignal, sig.rank);
  if (skip(d)) return skipped_state(d.action);
  return inner_->put_with_signal(dst, off, src, n, sig, value);
}

OpState FaultProxyTransport::test_signal(const SignalRef& sig, uint64_t value) {
  const Decision d = decide(FaultOp::kTestSignal, sig.rank);
  if (skip(d)) return d.action == FaultAction::kFail ? OpState::kFailed : OpState::kInProgress;
  return inner_->test_signal(sig, value);
}

OpState FaultProxyTransport::flush() {
  const Decision d = decide(FaultOp::kFlush, kAnyPeer);
  if (skip(d)) return skipped_state(d.action);
  return inner_->flush();
}

}  // namespace xds::xccl

// FaultProxyTransport: the real transport with faults injected (tests). It forwards every
// operation to the transport it wraps and, by rule, delays, drops or fails chosen ones, so
// that the protocols above meet a failing transport without mocking anything.
//
// A rule names an operation kind, optionally the rank the operation addresses, and which of
// the operations it matches it takes: the nth, counted from when the rule was added, and the
// count - 1 after it (kForever: every one from the nth on). Examples:
//   {kPut,           peer 1,   nth 3, count 1,        kFail}           the 3rd put to rank 1 fails
//   {kGet,           kAnyPeer, nth 1, kForever,       kDelay, 50 ms}   every get is delayed
//   {kPutWithSignal, kAnyPeer, nth 1, count 1,        kDrop}           the next signal is lost
// Actions:
//   kFail   not performed; returns OpState::kFailed.
//   kDrop   not performed, yet reported as done (kDone; test_signal reports kInProgress, "not
//           there yet"): the loss shows only where someone waits for it (its deadline).
//   kDelay  sleeps delay_ns on the calling thread, then performs it.
// Every rule counts every operation of its kind and peer; where several rules take the same
// operation, the first added decides.
// The rank an operation addresses: put dst.rank, get src.rank, put_with_signal and
// test_signal sig.rank, flush none (only kAnyPeer rules match a flush). register_memory() and
// caps() are forwarded untouched (on a load/store transport the protocols also read peers'
// memory directly; only what goes through the Transport can be faulted).
//
// Not in transport_table(): it has no Fabric of its own, it wraps a transport made there.
//
// Thread-safety: as the Transport interface, every call from any thread; add_rule(), clear()
// and stats() too (one mutex; the delay sleeps outside it).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "xccl/transport.h"

namespace xds::xccl {

enum class FaultOp : uint8_t { kPut, kGet, kPutWithSignal, kTestSignal, kFlush };
std::string_view fault_op_name(FaultOp op);

enum class FaultAction : uint8_t { kFail, kDrop, kDelay };

inline constexpr int kAnyPeer = -1;
inline constexpr uint64_t kForever = std::numeric_limits<uint64_t>::max();

struct FaultRule {
  FaultOp op = FaultOp::kPut;
  int peer = kAnyPeer;  // the rank the operation addresses, or any
  uint64_t nth = 1;     // the first matching operation taken (1-based, from add_rule)
  uint64_t count = 1;   // operations taken from the nth on (kForever: all)
  FaultAction action = FaultAction::kFail;
  int64_t delay_ns = 0;  // kDelay
};

struct FaultRuleStats {
  uint64_t matched = 0;  // operations of the rule's kind and peer since it was added
  uint64_t fired = 0;    // of those, the ones it acted on (decided)
};

class FaultProxyTransport final : public Transport {
 public:
  explicit FaultProxyTransport(std::unique_ptr<Transport> inner);

  // Adds a rule; returns its index for stats(). InvalidArgument for nth 0, count 0, a peer
  // below kAnyPeer or a negative delay.
  Result<size_t> add_rule(const FaultRule& rule);
  // Removes every rule (indices start again from 0).
  void clear();
  FaultRuleStats stats(size_t rule) const;
  Transport& inner() { return *inner_; }

  std::string_view name() const override { return "fault_proxy"; }
  TransportCaps caps() const override { return inner_->caps(); }
  Result<MemDesc> register_memory(const void* ptr, uint64_t bytes) override {
    return inner_->register_memory(ptr, bytes);
  }
  OpState put(const MemDesc& dst, uint64_t off, const void* src, uint64_t n) override;
  OpState get(void* dst, const MemDesc& src, uint64_t off, uint64_t n) override;
  OpState put_with_signal(const MemDesc& dst, uint64_t off, const void* src, uint64_t n,
                          const SignalRef& sig, uint64_t value) override;
  OpState test_signal(const SignalRef& sig, uint64_t value) override;
  OpState flush() override;

 private:
  struct Decision {
    bool act = false;  // a rule took the operation
    FaultAction action = FaultAction::kFail;
    int64_t delay_ns = 0;
  };
  // Counts the operation in every matching rule; the first rule that takes it decides.
  Decision decide(FaultOp op, int peer);
  // Sleeps through a delay; true for kFail / kDrop (the operation is not performed).
  static bool skip(const Decision& d);

  std::unique_ptr<Transport> inner_;
  mutable std::mutex mu_;
  std::vector<FaultRule> rules_;       // (mu_)
  std::vector<FaultRuleStats> stats_;  // (mu_) [rules_]
};

}  // namespace xds::xccl

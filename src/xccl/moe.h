// Dispatch/combine for expert parallelism (P038–P041), written against the Transport only.
//
// An Exchange connects a list of senders (devices that own tokens) with a list of receivers
// (devices that own experts; receiver position = device index of the ExpertMap). Symmetric
// expert parallelism uses senders = receivers = every device; A2E/E2A (a2e.h) uses trampolines
// as senders and expert devices as receivers.
//
// dispatch (sender S, receiver R):
//   1. S waits until every receiver released S's previous round (kDispatchDone), writes its
//      RouteEntry lists (one per receiver) into its staging, and, with INT8, quantizes the rows
//      some remote receiver needs (one scale per token, fused into that copy).
//   2. S posts counts to every receiver (kDispatchMeta: entries, map version, flags).
//   3. R waits for every sender's counts ("counts and offsets first"), pulls the route lists,
//      computes the grouped layout (group_by_expert), then pulls each (token, device) row once
//      into the first of its expert rows (dequantizing on arrival) and copies it locally to the
//      others. Rows of R's own tokens are read locally: nothing goes through the fabric to self.
//   4. R posts kDispatchDone to every sender: S may now overwrite its rows.
// combine:
//   5. R waits until every sender pulled R's previous pre-sums (kCombineDone), then pre-sums
//      each received (token, sender) over its local experts, weighted, in f32, stored as bf16
//      in presum[sender position][entry] of R's staging; posts kCombineReady.
//   6. S waits for kCombineReady from every receiver, pulls one vector per (token, device) and
//      sums them in f32 (ascending receiver order) into out[token]; posts kCombineDone.
// A maximum of max_tokens per sender per round is agreed up front (MoeConfig); more tokens go
// in further rounds: every sender flags "more" and the round loop continues while any did.
//
// Staging of one exchange endpoint (offsets from `ExchangeRoles::staging_base`, identical on
// every device; writer = the arena's owner, readers = peers pulling):
//   routes  [n_receivers][max_tokens] RouteEntry (104 B)
//   input   [max_tokens][hidden] bf16            (engine writes its tokens here: zero copy)
//   qrows   [max_tokens][int8_row_bytes(hidden)] (INT8 only)
//   presum  [n_senders][max_tokens][hidden] bf16
// Each region starts on a 64-byte boundary.
//
// Thread-safety: one thread drives an Exchange; the copy work runs on the ThreadPool given.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "xccl/expert_map.h"
#include "xccl/mailbox.h"

namespace xds::xccl {

struct MoeConfig {
  int hidden = 0;            // H, elements per token row (bf16)
  int topk = 8;              // k <= kMaxTopk
  int max_tokens = 0;        // per sender per round
  int slots_per_device = 1;  // local expert slots on a receiver, spares included
  bool int8 = false;         // quantize dispatch payload to INT8 (+ one f32 scale per token)
  int64_t timeout_ms = 30'000;
  BackoffPolicy backoff{};
};

struct ExchangeLayout {
  uint64_t routes = 0, input = 0, qrows = 0, presum = 0, end = 0;  // absolute arena offsets
};
ExchangeLayout exchange_layout(const MoeConfig& c, int n_senders, int n_receivers, uint64_t base);
// Staging bytes a symmetric dispatcher over `world` devices needs.
inline uint64_t moe_staging_bytes(const MoeConfig& c, int world) {
  return exchange_layout(c, world, world, 0).end;
}

struct ExchangeRoles {
  std::vector<int> senders;
  std::vector<int> receivers;
  uint64_t staging_base = 0;  // absolute arena offset of this exchange's staging
  Channel meta = Channel::kDispatchMeta, done = Channel::kDispatchDone;
  Channel ready = Channel::kCombineReady, cdone = Channel::kCombineDone;
  OpKind tokens_op = OpKind::kDispatch, vectors_op = OpKind::kCombine;
};

struct ExchangeStats {
  uint64_t bytes_pulled_tokens = 0;   // row bytes this device pulled from peers (dispatch)
  uint64_t bytes_pulled_vectors = 0;  // vector bytes pulled from peers (combine)
};

class Exchange {
 public:
  static Result<std::unique_ptr<Exchange>> create(Mailbox& mb, const MoeConfig& cfg,
                                                  ExchangeRoles roles, ThreadPool* pool);

  // ---- sender side ----
  // Waits until the previous round's rows are released; returns input [max_tokens, hidden].
  Result<uint16_t*> input_rows();
  // Same for the INT8 rows [max_tokens][int8_row_bytes] (a trampoline fills them directly).
  Result<std::byte*> int8_rows();
  // Routes n_tokens rows of input_rows() (or, with rows_quantized, of int8_rows()).
  Status send_tokens(const RoutePlan& plan, uint64_t map_version, int n_tokens, uint64_t key,
                     bool more, bool rows_quantized = false);
  // Pulls one pre-summed vector per (token, receiver) and sums: out [n_tokens, hidden] bf16.
  Status gather_vectors(uint16_t* out, uint64_t key);

  // ---- receiver side ----
  Status recv_tokens(uint64_t key);
  const RecvLayout& received() const { return layout_; }
  const uint16_t* received_rows() const { return rows_.data(); }  // [n_rows, hidden]
  uint16_t* expert_out() { return out_.data(); }                  // [n_rows, hidden]
  bool any_more() const { return any_more_; }
  // Pre-sums expert_out() per (token, sender) and publishes it.
  Status send_vectors(uint64_t key);

  // ---- symmetric helpers (this device is sender and receiver) ----
  Status dispatch(int n_tokens, std::span<const int32_t> topk_ids, std::span<const float> weights,
                  const ExpertMap& map, uint64_t key, bool more = false);
  Status combine(uint16_t* out, uint64_t key);

  // Waits for every outstanding release (receivers done pulling this device's rows and
  // vectors). Call before dropping an Exchange whose channels another one will reuse.
  Status finish();

  const ExchangeStats& stats() const { return stats_; }
  const MoeConfig& config() const { return cfg_; }
  int sender_pos() const { return my_sender_; }
  int receiver_pos() const { return my_receiver_; }

 private:
  Exchange(Mailbox& mb, const MoeConfig& cfg, ExchangeRoles roles, ThreadPool* pool);
  Status wait_released(bool tokens);
  void parallel(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);
  WaitCtx ctx(OpKind op) const;

  Mailbox& mb_;
  Fabric& f_;
  Transport& t_;
  MoeConfig cfg_;
  ExchangeRoles roles_;
  ThreadPool* pool_;
  ExchangeLayout lay_;
  int my_sender_ = -1, my_receiver_ = -1;
  std::vector<int> remote_receivers_, remote_senders_;  // ranks, self excluded
  uint64_t rows_stride_ = 0;                            // hidden * 2 bytes

  // sender state
  RoutePlan plan_;
  int n_tokens_ = 0;
  uint64_t key_tokens_ = 0;
  std::vector<uint32_t> ref_offset_;                // [n_tokens + 1] CSR over (receiver, entry)
  std::vector<std::pair<int32_t, uint32_t>> refs_;  // (receiver position, entry index)
  bool more_ = false, rows_quantized_ = false;
  uint64_t token_rounds_ = 0, token_released_ = 0;
  uint64_t vector_rounds_ = 0, vector_released_ = 0;
  uint64_t key_released_[2] = {0, 0};  // key of the last round whose release is awaited

  // receiver state
  std::vector<std::vector<RouteEntry>> from_;  // [n_senders] entries pulled (self: copied)
  std::vector<int> from_flags_;                // [n_senders] bit 1: rows are INT8
  RecvLayout layout_;
  std::vector<uint16_t> rows_, out_;  // [n_rows, hidden]
  bool any_more_ = false;
  uint64_t map_version_ = 0;
  ExchangeStats stats_;
};

}  // namespace xds::xccl

namespace xds::xccl {

// Expert computation of one round: rows [n_rows, hidden] grouped as ex.received() says;
// writes outputs [n_rows, hidden] (the same order) to out.
using ExpertFn = std::function<void(const Exchange& ex, const uint16_t* rows, uint16_t* out)>;

// One MoE layer over any number of tokens (symmetric exchange): rounds of at most max_tokens
// per device, each = copy into input_rows, dispatch, expert_fn, combine. Round i uses key + i.
// Every device keeps joining rounds (with zero tokens when it has none left) until no device
// flagged more. x [n_tokens, hidden] bf16, topk_ids/weights [n_tokens, topk], out [n_tokens,
// hidden] bf16.
Status run_moe_rounds(Exchange& ex, const uint16_t* x, std::span<const int32_t> topk_ids,
                      std::span<const float> weights, int n_tokens, const ExpertMap& map,
                      uint64_t key, const ExpertFn& expert_fn, uint16_t* out);

}  // namespace xds::xccl

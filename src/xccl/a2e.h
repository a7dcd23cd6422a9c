// A2E / E2A between attention devices and expert devices, with trampoline forwarding
// (P042–P047), addressed by (DP domain, round) so that one domain talks to the experts at a
// time (P110).
//
// Topology: attention devices are split into DP domains; expert devices hold the experts
// (ExpertMap device index = position in `experts`). The attention device at position i of a
// domain is paired with trampoline experts[i] (so a domain has at most |experts| devices).
//
// A2E for domain D, one round:
//   1. attention a (position i) writes its rows (INT8: quantized, one scale per token), top-k
//      ids and weights into its staging; posts kA2eToTrampoline to experts[i].
//   2. trampoline experts[i] pulls all of a's rows and routing (one peer instead of every
//      expert device: the fan-out P044 warns about stays on the expert side), routes them with
//      the expert map and acts as the sender of a dispatch (moe.h Exchange, channels
//      kA2eForward / kA2eForwardDone) to every expert device; posts kA2eTrampolineDone to a.
//   3. every expert device pulls from the trampolines, grouped by local expert (rows of the
//      trampoline itself are read locally).
// E2A reverses it: every expert device pre-sums per (token, trampoline) (kE2aToTrampoline),
// each trampoline pulls and sums one vector per (token, expert device) into its e2a staging and
// posts kE2aToAttention; the attention device pulls [n_tokens, hidden] and posts
// kE2aAttentionDone.
//
// Staging (absolute offsets, identical on every device of the fabric):
//   [exchange area: exchange_layout(cfg, max domain size, |experts|, staging)]
//   att_input [max_tokens][hidden] row_dtype · att_q [max_tokens][int8 stride] · att_ids
//   [max_tokens][topk] i32 · att_w [max_tokens][topk] f32 · e2a_out [max_tokens][hidden]
//   vector_dtype
//
// Rows and vectors are both bf16, or both f32 (MoeConfig::row_dtype / vector_dtype; the f32
// reference mode of an A/E instance); others: Unimplemented. INT8 rows are quantized from
// bf16 rows only.
//
// Thread-safety: one thread per device drives its A2e.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "xccl/moe.h"

namespace xds::xccl {

struct A2eTopology {
  std::vector<std::vector<int>> domains;  // attention ranks per DP domain, position order
  std::vector<int> experts;               // expert device ranks
  // false: no trampoline (for comparison) -- every attention device is a dispatch sender
  // to every expert device itself (one Exchange per domain, channels kDispatchMeta ..
  // kCombineDone, staging area d at exchange.routes + d * its size), and routes its rows
  // with the expert map it is given (a2e_send's map).
  bool trampoline = true;
};

// Pure: checks sizes and disjointness.
Status validate(const A2eTopology& t, int world_size);
// Pure: where attention rank `rank` sits, or {-1, -1}.
struct AttentionPos {
  int domain = -1;
  int index = -1;
};
AttentionPos attention_pos(const A2eTopology& t, int rank);
// Key of (step, layer, domain, round): every device of the exchange presents the same.
inline uint64_t a2e_key(uint32_t epoch, uint32_t step, uint16_t layer, int domain, int round) {
  return collective_key(epoch, step, layer, uint16_t((domain & 0xF) << 8 | (round & 0xFF)));
}

struct A2eLayout {
  ExchangeLayout exchange;  // trampolines' (or, without trampoline, domain 0's)
  uint64_t domain_stride = 0;  // without trampoline: bytes from domain d's exchange to d + 1's
  uint64_t att_input = 0, att_q = 0, att_ids = 0, att_w = 0, e2a_out = 0, end = 0;
};
A2eLayout a2e_layout(const MoeConfig& c, const A2eTopology& t, uint64_t staging);

class A2e {
 public:
  static Result<std::unique_ptr<A2e>> create(Mailbox& mb, const MoeConfig& cfg, A2eTopology topo,
                                             ThreadPool* pool);

  // ---- attention side ----
  // Waits until the trampoline pulled the previous round; returns [max_tokens, hidden] of
  // row_dtype (input_rows: bf16 only).
  Result<std::byte*> input_data();
  Result<uint16_t*> input_rows();
  // `map`: the expert map the rows are routed with; needed without trampoline (the
  // trampoline routes them otherwise), ignored with one.
  Status a2e_send(int n_tokens, std::span<const int32_t> topk_ids, std::span<const float> weights,
                  uint64_t key, bool more = false, const ExpertMap* map = nullptr);
  // out [n_tokens, hidden] of vector_dtype: sum over experts of weight * expert output.
  Status e2a_recv(uint16_t* out, uint64_t key);  // bf16 vectors
  Status e2a_recv(float* out, uint64_t key);     // f32 vectors

  // ---- expert side ----
  // Serves domain D: trampolines forward, every expert device receives grouped rows.
  Status a2e_recv(int domain, const ExpertMap& map, uint64_t key);
  const Exchange& exchange() const { return cur(); }
  const uint16_t* row(int r) const { return cur().row(r); }  // token row of grouped row r
  uint16_t* expert_out() { return cur().expert_out(); }
  float* expert_out_f32() { return cur().expert_out_f32(); }
  // Source of received row r: (attention rank, token).
  std::pair<int, uint32_t> row_source(int r) const;
  bool any_more() const { return cur().any_more(); }
  Status e2a_send(uint64_t key);

  bool is_attention() const { return pos_.domain >= 0; }
  // Rounds an attention device may send before it receives the first one's E2A: 2 with a
  // trampoline; 1 without (the domain's Exchange keeps one round's routes on the sender).
  int max_in_flight() const { return direct_.empty() ? 2 : 1; }
  uint64_t bytes_pulled() const;  // stage-1 + exchange bytes this device pulled

 private:
  A2e(Mailbox& mb, const MoeConfig& cfg, A2eTopology topo, ThreadPool* pool);
  WaitCtx ctx(OpKind op) const;
  Status e2a_recv_bytes(std::byte* out, RowDType out_dtype, uint64_t key);
  // The exchange the expert side serves now: the trampolines', or domain_'s without them.
  Exchange& cur() const { return direct_.empty() ? *ex_ : *direct_[size_t(std::max(domain_, 0))]; }

  Mailbox& mb_;
  Fabric& f_;
  Transport& t_;
  MoeConfig cfg_;
  A2eTopology topo_;
  ThreadPool* pool_;
  A2eLayout lay_;
  AttentionPos pos_;
  int expert_index_ = -1;
  std::unique_ptr<Exchange> ex_;  // expert devices only (trampoline)
  // Without trampoline: expert devices [domains], an attention device [1] (its domain's).
  std::vector<std::unique_ptr<Exchange>> direct_;
  // attention state
  bool att_pending_release_ = false;
  uint64_t att_key_ = 0;
  // (key, tokens) of the rounds sent whose E2A is not received yet, oldest first: a caller
  // may send the next round before it receives the current one (two in flight).
  std::vector<std::pair<uint64_t, int>> att_sent_;
  // trampoline state
  int domain_ = -1;
  int partner_ = -1;       // attention rank served this round, -1 if none
  int last_partner_ = -1;  // whose e2a_out pull is still outstanding
  uint64_t last_partner_key_ = 0;
  int partner_tokens_ = 0;
  uint64_t stage1_pulled_ = 0;
};

}  // namespace xds::xccl

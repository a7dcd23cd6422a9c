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
//      some remote receiver needs (one scale per token) unless the engine already wrote them
//      (SenderRows::kBf16AndInt8: quantized in the producer's epilogue, off the critical path).
//   2. S posts counts to every receiver (kDispatchMeta: entries, map version, flags).
//   3. R waits for every sender's counts ("counts and offsets first"), pulls the route lists,
//      then pulls each (token, device) row ONCE, straight from S's input staging into its
//      token buffer (runs of consecutive tokens in one copy; INT8 dequantized on arrival, or
//      kept as INT8 for the expert GEMM with MoeConfig::int8_to_experts). No
//      pack, no ring, no second copy: "grouped by local expert" is a per-local-expert row-index
//      table (group_by_expert: expert -> rows, each naming its token row and weight), built
//      from the route lists; the expert GEMM gathers its rows through row(r) anyway. Rows of
//      R's own tokens are not copied at all: row(r) points into R's own input staging.
//   4. R posts kDispatchDone to every sender: S may now overwrite its rows.
// combine:
//   5. R waits until every sender pulled R's previous pre-sums (kCombineDone), then pre-sums
//      each received (token, remote sender) over its local experts, weighted, in f32, stored as
//      vector_dtype in presum[sender position][entry] of R's staging; posts kCombineReady.
//   6. S waits for kCombineReady from every remote receiver and sums, per token in f32 in
//      ascending receiver order, one pulled vector per (token, remote device); its own
//      experts' share is pre-summed in the same loop from its own expert outputs (nothing
//      goes through staging to self). Posts kCombineDone.
// Flags per round and pair: kDispatchMeta and kCombineReady are on the critical path (one
// one-way line transfer each); kDispatchDone / kCombineDone are releases, normally already
// there when the next round waits for them.
// A maximum of max_tokens per sender per round is agreed up front (MoeConfig); more tokens go
// in further rounds: every sender flags "more" and the round loop continues while any did.
//
// Row types (MoeConfig): token rows are `row_dtype` (f32 or bf16) in the input staging and in
// the receiver's buffers; on the wire they travel as that type, or as INT8 (MoeConfig::int8,
// bf16 rows only: quantized per token, dequantized to bf16 on arrival). Expert outputs,
// pre-sums and the combine output are `vector_dtype` (f32 or bf16); every sum runs in f32 with
// fused multiply-adds in a fixed order, rounded once to the vector type. f32 rows both ways
// keep `--compute-dtype f32` the reference through expert parallelism: the result equals the
// local computation up to the summation order. R = row bytes (4 or 2), V = vector bytes.
//
// Staging of one exchange endpoint (offsets from `ExchangeRoles::staging_base`, identical on
// every device; writer = the arena's owner, readers = peers pulling):
//   routes  [n_receivers][max_tokens] RouteEntry (104 B)
//   input   [max_tokens][hidden] row_dtype         (engine writes its tokens here: zero copy)
//                                                  = max_tokens * hidden * R bytes
//   qrows   [max_tokens][int8_row_stride(hidden)]  (INT8 only)
//   presum  [n_senders][max_tokens][hidden] vector_dtype (own block: only with send_presummed)
//                                                  = n_senders * max_tokens * hidden * V bytes
// Each region starts on a 64-byte boundary.
//
// Receiver buffers of one round (heap, reused; valid until the next recv_tokens):
//   tokens  [remote (sender, entry) units][hidden] row_dtype: pulled rows, one per (token,
//           device)
//   row(r)  grouped row r (0 <= r < received().n_rows()) -> its token row: a row of `tokens`,
//           or of this device's own input staging (valid until the next input_rows())
//   out     [n_rows][hidden] vector_dtype: expert outputs, grouped order, written by the engine
//
// Thread-safety: one thread drives an Exchange; the copy work runs on the ThreadPool given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "xccl/expert_map.h"
#include "xccl/mailbox.h"

namespace xds::xccl {

// Element type of token rows and combine vectors.
enum class RowDType : uint8_t { kBf16, kF32 };
inline uint64_t row_dtype_bytes(RowDType t) {
  return t == RowDType::kF32 ? 4 : 2;
}
const char* row_dtype_name(RowDType t);

struct MoeConfig {
  int hidden = 0;            // H, elements per token row
  int topk = 8;              // k <= kMaxTopk
  int max_tokens = 0;        // per sender per round
  int slots_per_device = 1;  // local expert slots on a receiver (E / N + spare slots S)
  bool int8 = false;         // quantize dispatch payload to INT8 (+ one f32 scale per token);
                             // bf16 token rows only
  int64_t timeout_ms = 30'000;
  BackoffPolicy backoff{};
  RowDType row_dtype = RowDType::kBf16;     // token rows (input staging, received rows)
  RowDType vector_dtype = RowDType::kBf16;  // expert outputs, pre-sums, combine output
  // Own (uncompressed) rows are copied into the receiver's token buffer too, so that every
  // grouped row's input is a row of one array: row(r) = unit_rows() + row_units()[r] rows
  // (a grouped expert GEMM gathers by index). Off: own rows are read in place (no copy).
  bool contiguous_rows = false;
  // INT8 rows stay INT8 on arrival, for an expert GEMM that takes per-token INT8 activations
  // (W8A8 experts): every grouped row, own ones included, is an INT8 row of int8_row_bytes
  // (values, then the f32 scale at byte int8_row_bytes(hidden) - 4), int8_row_stride(hidden)
  // bytes apart in unit_rows() (own rows read in place from the qrows staging unless
  // contiguous_rows). Nothing is dequantized. Needs int8 and SenderRows::kInt8 (every row is
  // sent INT8, quantized by its producer), for any row_dtype.
  bool int8_to_experts = false;
};

// 64-byte aligned heap bytes (operator new[] with align_val_t(64)).
struct AlignedDelete {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using RowBuffer = std::unique_ptr<std::byte[], AlignedDelete>;

// What a sender's engine wrote into its staging for a round (send_tokens / dispatch):
//   kBf16         input_rows() only. With MoeConfig::int8, dispatch quantizes the rows some
//                 remote receiver needs (on the critical path).
//   kBf16AndInt8  input_rows() and, for every token, int8_rows() (quantize_row_int8, e.g. in
//                 the producer's epilogue while the row is in registers): dispatch does no
//                 quantizing, receivers only dequantize; own experts read the bf16 rows in
//                 place. Needs MoeConfig::int8.
//   kInt8         int8_rows() only (a trampoline forwarding INT8 rows); own rows are
//                 dequantized like remote ones. Needs MoeConfig::int8.
enum class SenderRows : uint8_t { kBf16, kBf16AndInt8, kInt8 };

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
  // Waits until the previous round's rows are released; returns input [max_tokens, hidden]
  // of row_dtype. The typed forms fail (FailedPrecondition) on the other row type.
  Result<std::byte*> input_data();
  Result<uint16_t*> input_rows();     // bf16 rows
  Result<float*> input_rows_f32();    // f32 rows
  // Same for the INT8 rows [max_tokens][int8_row_bytes] (a trampoline fills them directly).
  Result<std::byte*> int8_rows();
  // Routes n_tokens rows; `rows` says what the engine wrote (SenderRows).
  Status send_tokens(const RoutePlan& plan, uint64_t map_version, int n_tokens, uint64_t key,
                     bool more, SenderRows rows = SenderRows::kBf16);
  // Pulls one pre-summed vector per (token, receiver) and sums: out [n_tokens, hidden] of
  // vector_dtype (the other pointer type: InvalidArgument, before anything is posted).
  Status gather_vectors(uint16_t* out, uint64_t key);
  Status gather_vectors(float* out, uint64_t key);

  // ---- receiver side ----
  Status recv_tokens(uint64_t key);
  // Per-local-expert table: rows grouped by local expert (source, token, expert, weight).
  const RecvLayout& received() const { return layout_; }
  // Token row [hidden] of grouped row r (no copy per expert: rows of one token share it), as
  // bytes and typed (row() for bf16 rows, row_f32() for f32 rows; the caller knows which).
  const std::byte* row_data(int r) const { return row_ptr_[size_t(r)]; }
  const uint16_t* row(int r) const { return reinterpret_cast<const uint16_t*>(row_data(r)); }
  const float* row_f32(int r) const { return reinterpret_cast<const float*>(row_data(r)); }
  // Expert outputs [n_rows, hidden] of vector_dtype, grouped order.
  std::byte* expert_out_data() { return out_.get(); }
  uint16_t* expert_out() { return reinterpret_cast<uint16_t*>(out_.get()); }
  float* expert_out_f32() { return reinterpret_cast<float*>(out_.get()); }
  bool any_more() const { return any_more_; }
  // Pre-sums expert_out() per (token, sender) and publishes it.
  Status send_vectors(uint64_t key);
  // The other combine input: the engine pre-sums itself (e.g. in its expert GEMM's epilogue,
  // from f32 accumulators) and writes one vector [hidden] (vector_dtype) per unit = received (token,
  // sender) straight into presum_vector(unit), in staging where the sender pulls it (written
  // once, pulled once); then send_presummed() publishes. Units: 0 <= u < n_units(); grouped
  // row r belongs to unit unit_of(r). Call presum_vector() only after wait_vectors_free().
  int n_units() const { return int(unit_start_.empty() ? 0 : unit_start_.back()); }
  uint32_t unit_of(int r) const { return uint32_t(row_unit_[size_t(r)]); }
  // [n_rows] unit of each grouped row (as unit_of), and the token buffer [n_units][hidden]
  // of row_dtype that holds every unit's row when MoeConfig::contiguous_rows is set.
  std::span<const int32_t> row_units() const { return row_unit_; }
  // Bytes from one unit row to the next in unit_rows(): hidden · R, or int8_row_stride(hidden)
  // with MoeConfig::int8_to_experts.
  uint64_t unit_row_bytes() const { return unit_stride_; }
  const std::byte* unit_rows() const { return tokens_.get(); }
  Status wait_vectors_free();  // the senders pulled the previous round's vectors
  std::byte* presum_vector_data(uint32_t unit);
  uint16_t* presum_vector(uint32_t unit) {
    return reinterpret_cast<uint16_t*>(presum_vector_data(unit));
  }
  float* presum_vector_f32(uint32_t unit) {
    return reinterpret_cast<float*>(presum_vector_data(unit));
  }
  Status send_presummed(uint64_t key);

  // ---- symmetric helpers (this device is sender and receiver) ----
  Status dispatch(int n_tokens, std::span<const int32_t> topk_ids, std::span<const float> weights,
                  const ExpertMap& map, uint64_t key, bool more = false,
                  SenderRows rows = SenderRows::kBf16, std::span<const uint32_t> spread = {});
  Status combine(uint16_t* out, uint64_t key);  // out of vector_dtype (bf16 or f32 form)
  Status combine(float* out, uint64_t key);
  Status combine_presummed(uint16_t* out, uint64_t key);  // send_presummed + gather_vectors
  Status combine_presummed(float* out, uint64_t key);

  // Waits for every outstanding release (receivers done pulling this device's rows and
  // vectors). Call before dropping an Exchange whose channels another one will reuse.
  Status finish();

  // A failed transport operation (a get, a put, a post) ends the call with Abandoned, as does
  // a peer's abort marker while the mailbox watches the attempt (Mailbox::watch). Then every
  // device of the fabric calls abandon(tag) (Mailbox::abandon): when it returns ok nobody
  // posts or pulls anything of the attempt any more, no release is outstanding, and the
  // next round starts clean (under new keys). Its error (a poison status) is permanent.
  Status abandon(uint64_t tag);

  const ExchangeStats& stats() const { return stats_; }
  const MoeConfig& config() const { return cfg_; }
  int sender_pos() const { return my_sender_; }
  int receiver_pos() const { return my_receiver_; }

 private:
  Exchange(Mailbox& mb, const MoeConfig& cfg, ExchangeRoles roles, ThreadPool* pool);
  Status wait_released(bool tokens);
  // Tells every remote sender that this round's pre-summed vectors are ready to pull.
  Status publish_vectors(uint64_t key);
  // Expert-output rows and gate weights of (sender position s, entry i); returns n_local.
  int entry_rows(size_t s, size_t i, const std::byte** rows, float* w) const;
  Status gather_into(std::byte* out, RowDType out_dtype, uint64_t key);
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
  uint64_t rows_stride_ = 0;                            // hidden * R bytes (token rows)
  uint64_t vec_stride_ = 0;                             // hidden * V bytes (vectors)
  uint64_t unit_stride_ = 0;  // token buffer rows: rows_stride_, or the INT8 row stride

  // sender state
  RoutePlan plan_;
  int n_tokens_ = 0;
  uint64_t key_tokens_ = 0;
  std::vector<uint32_t> ref_offset_;                // [n_tokens + 1] CSR over (receiver, entry)
  std::vector<std::pair<int32_t, uint32_t>> refs_;  // (receiver position, entry index)
  bool more_ = false;
  SenderRows rows_ = SenderRows::kBf16;
  uint64_t token_rounds_ = 0, token_released_ = 0;
  uint64_t vector_rounds_ = 0, vector_released_ = 0;
  uint64_t key_released_[2] = {0, 0};  // key of the last round whose release is awaited

  // receiver state
  std::vector<std::vector<RouteEntry>> from_;  // [n_senders] entries pulled (self: copied)
  std::vector<int> from_flags_;                // [n_senders] bit 1: rows are INT8
  std::vector<uint32_t> unit_start_;           // [n_senders + 1] CSR over (sender, entry)
  RecvLayout layout_;
  RowBuffer tokens_, out_;                    // see "Receiver buffers" (grow-only, not zeroed)
  size_t tokens_cap_ = 0, out_cap_ = 0;       // bytes
  std::vector<const std::byte*> row_ptr_;     // [n_rows]
  std::vector<int32_t> row_unit_;             // [n_rows]
  bool presummed_ = false;  // this round's own share was pre-summed by the engine
  bool any_more_ = false;
  uint64_t map_version_ = 0;
  ExchangeStats stats_;
};

}  // namespace xds::xccl

namespace xds::xccl {

// Expert computation of one round: grouped row r (ex.received().rows[r], input ex.row(r));
// writes outputs [n_rows, hidden] (grouped order) to out.
using ExpertFn = std::function<void(const Exchange& ex, uint16_t* out)>;
using ExpertFnF32 = std::function<void(const Exchange& ex, float* out)>;  // f32 rows, f32 out

// One MoE layer over any number of tokens (symmetric exchange): rounds of at most max_tokens
// per device, each = copy into input_rows, dispatch, expert_fn, combine. Round i uses key + i.
// Every device keeps joining rounds (with zero tokens when it has none left) until no device
// flagged more. x [n_tokens, hidden] bf16, topk_ids/weights [n_tokens, topk], out [n_tokens,
// hidden] bf16 (row and vector types bf16).
Status run_moe_rounds(Exchange& ex, const uint16_t* x, std::span<const int32_t> topk_ids,
                      std::span<const float> weights, int n_tokens, const ExpertMap& map,
                      uint64_t key, const ExpertFn& expert_fn, uint16_t* out);
// The same with f32 rows and f32 vectors (MoeConfig row_dtype = vector_dtype = kF32).
Status run_moe_rounds(Exchange& ex, const float* x, std::span<const int32_t> topk_ids,
                      std::span<const float> weights, int n_tokens, const ExpertMap& map,
                      uint64_t key, const ExpertFnF32& expert_fn, float* out);

}  // namespace xds::xccl

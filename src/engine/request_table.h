// The DP group's requests and sequences between steps: what the scheduler sees, what a step
// feeds the model, and what it commits afterwards. One Sequence per choice of a request
// (n > 1 forks the prefilled sequence). No sockets, no model: the table takes the step's
// outputs (logits, hidden rows) and commits them through KvManager; the engine core
// (engine/engine_core.h) runs the forward in between.
//
// A sequence's tokens are prompt + output; `computed` positions have KV. It prefills
// towards `target` (the prompt, or prompt + output after a preemption), then decodes one
// position per step: the token at `computed` (the last sampled one) goes in, one comes out.
//
// A step: plan() (the pure schedule() over the lists) -> apply() (preempt, admit, reserve KV,
// the chunks to run) -> the forward (the caller) -> commit() (sample, emit deltas, commit KV)
// -> end_step(). rollback() instead of end_step() undoes the step after apply(): every
// sequence the step ran gets back its tokens, lengths and MTP state, its KV is truncated to
// the committed length it had (KvManager::rewind), the choices forked in the step are dropped
// and no delta of the step is left. A choice that finished during the step gave its KV back
// already: it is restored as preempted (recomputed from its tokens, the prefix cache helps).
// Admissions and preemptions of apply() stand: they are scheduling, not the step's result.
//
// Thread-safety: not thread-safe; the device's main thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/kv_manager.h"
#include "engine/scheduler.h"
#include "model/kv_storage.h"
#include "model/speculative_decode.h"
#include "model/step_io.h"
#include "protocol/payloads.h"

namespace xds::engine {

enum class SeqState : uint8_t {
  kWaiting,     // placed, holds no KV
  kRunning,     // holds KV (prefilling or decoding)
  kPreempted,   // lost its KV; recomputed when admitted again
  kAwaitingKv,  // decode phase of a disaggregated request: its KV waits on a prefill group
  kPullingKv,   // its blocks reserved, the pull posted (KvPuller): running once it completes
  kParked,      // prefill phase done: holds its KV until the decode side has pulled it
  kFinished,
};

struct Request;

struct Sequence {
  int64_t id = 0;       // unique in the group
  int64_t arrival = 0;  // FCFS order (forks share their parent's, +index)
  Request* request = nullptr;
  int32_t index = 0;         // choice index
  SamplingOptions sampling;  // the request's, with the choice's seed (choice_seed)
  SeqState state = SeqState::kWaiting;
  std::vector<int32_t> tokens;  // prompt + output
  int64_t computed = 0;         // positions with KV
  int64_t target = 0;           // prefill target
  int64_t output_sent = 0;      // output tokens already sent to the output process
  int64_t kv = -1;              // KvManager sequence id while holding KV
  int32_t cached_tokens = 0;    // prompt tokens attached from the prefix cache
  bool forked = false;          // n > 1 children exist (choice 0 only)
  std::string finish_reason;
  // MTP speculative decoding (k > 0): drafts and the rows waiting for the draft-extend
  // (spec.length == computed between steps), this step's verify chunk [x_L, drafts], and
  // whether rows were committed this step (it then joins this step's MTP passes).
  MtpSpecState spec;
  std::vector<int32_t> verify;
  bool spec_committed = false;
  // Prefill/decode disaggregation: the index in the step's deltas of the first-token delta
  // that carries the handoff (-1: none), and the transfer id while parked.
  int64_t handoff_delta = -1;
  uint64_t transfer = 0;
  bool cancel_after_pull = false;  // cancelled while its blocks were being written

  int64_t prompt_len() const;
  int64_t output_len() const { return static_cast<int64_t>(tokens.size()) - prompt_len(); }
};

struct Request {
  EngineRequest req;
  std::vector<Sequence*> choices;  // [n], choice 0 first; the others after the fork
  bool cancelled = false;
  int32_t finished = 0;  // choices finished
  // Sent again after a fault (EngineRequest::resume): every choice was made at add(), each
  // recomputed from its own tokens; none is forked and none samples for another.
  bool resumed = false;
};

inline int64_t Sequence::prompt_len() const {
  return static_cast<int64_t>(request->req.prompt.size());
}

class Sampler;
class SpeculativeStage;

struct RequestTableOptions {
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  bool chunked_prefill = true;
  int64_t block_size = 16;
  int64_t max_model_len = 0;  // the context's end ("length"); > 0
  int64_t valid_vocab = 0;    // ids that can be sampled: [0, valid_vocab)
  std::vector<int32_t> eos_ids;
  // Prefill/decode disaggregation: a prefill-only request (n = 1) that sampled its first token
  // is listed in handoffs() to be parked (engine/handoff_stage.h).
  bool park_prefill_only = false;
  // Logits of every prefill token, not only each chunk's last (`generate --dump-logits`).
  bool all_logits = false;
};

// Counters since creation.
struct RequestTableStats {
  int64_t prefix_hits = 0, prefix_queries = 0;  // blocks
  int64_t preemptions = 0;
  int64_t kv_blocks_retired = 0;    // retire_kv_blocks(), retire_bad_blocks()
  int64_t retired_recomputes = 0;   // sequences recomputed because they held a retired block
};

class RequestTable {
 public:
  // `kv` (and `storage`, for the copies of a fork; may be null when no request has n > 1)
  // must outlive the table.
  RequestTable(const RequestTableOptions& options, KvManager& kv, KvStorage* storage);
  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;
  ~RequestTable();

  // MTP speculative decoding (null: off); it must outlive the table.
  void set_speculative(SpeculativeStage* spec) { spec_ = spec; }
  // Called by finish() for a parked sequence (its transfer is closed there).
  void set_on_finish_parked(std::function<void(Sequence&)> fn) {
    on_finish_parked_ = std::move(fn);
  }

  // A new request: waiting, or awaiting its KV for a decode phase (RequestPhase::kDecode).
  // A resumed one (EngineRequest::resume, n entries): each choice made at once, recomputed
  // from prompt + its resumed ids like a preempted sequence (waiting when it has none, ended
  // when resume_finished says so); nothing already resumed is sent again. InvalidArgument for
  // an id the table holds, or a resume that does not match n or the context.
  Status add(EngineRequest r);
  // Stops choice `index` of request `id` (-1: every choice); its request is released by
  // release_finished() once every choice ended. A choice whose KV is being pulled ends when
  // the pull completes.
  void cancel(const std::string& id, int32_t index);
  // Ends a choice: frees its KV; with `emit`, queues a final delta with the reason.
  void finish(Sequence& s, const std::string& reason, bool emit = true);
  // Drops its KV; recomputed when admitted again.
  void preempt(Sequence& s);
  // Bad memory (P120), between steps: retires up to `count` KV blocks that running sequences
  // hold (their committed blocks, in the running order; KvManager::retire), then every
  // running sequence holding a retired block is preempted: recomputed into good blocks, its
  // tokens kept, nothing sent twice. Returns the blocks retired.
  int64_t retire_kv_blocks(int64_t count);
  // Drops the requests whose choices all ended; their ids are appended to *released.
  void release_finished(std::vector<std::string>* released = nullptr);
  bool has_work() const {
    return !running_.empty() || !waiting_.empty() || !preempted_.empty() || !awaiting_.empty() ||
           !pulling_.empty();
  }

  // The step's plan (schedule() over the lists, the awaiting handoffs included).
  Status plan(StepPlan& plan);
  // Applies `plan` (kept by reference until end_step/rollback): preempts, ends the
  // unfittable, admits (attaching prefix-cache hits), reserves the chunks' KV. chunks() then
  // holds what the forward runs. An empty plan is valid (a step with no rows).
  Status apply(const StepPlan& plan);
  std::span<const TokenChunk> chunks() const { return chunks_; }
  // The forward's output for chunks(): every chunk samples (prefill) or verifies (decode with
  // speculation); deltas() gets the tokens. With speculation the MTP passes run after.
  Status commit(const StepOutput& out, int64_t vocab, int64_t hidden_size, Sampler& sampler,
                bool run_empty_passes);
  void end_step();
  // Undoes the step begun by apply() (the header comment).
  Status rollback();

  // The deltas of the steps so far; the caller moves them out.
  std::vector<TokenDelta>& deltas() { return deltas_; }
  // Prefill-only sequences of this step that sampled their first token (park_prefill_only).
  std::vector<Sequence*>& handoffs() { return handoffs_; }

  Sequence* find(int64_t seq);
  const std::unordered_map<std::string, std::unique_ptr<Request>>& requests() const {
    return requests_;
  }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::vector<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& preempted() const { return preempted_; }
  const std::vector<Sequence*>& awaiting() const { return awaiting_; }
  const std::vector<Sequence*>& pulling() const { return pulling_; }
  // Handoffs: awaiting -> pulling (its blocks reserved), pulling -> awaiting (for finish),
  // and -> running once the pull completed (its KV committed by the caller).
  void start_pull(Sequence& s);
  void end_pull(Sequence& s);
  // A handoff whose KV cannot be pulled (its link failed, its blocks came corrupted), after
  // end_pull(): `bad` (blocks of s's table whose memory went bad) is retired, the rest freed,
  // and it is recomputed from its tokens (prompt + the prefill side's output) like a
  // preempted sequence, then decodes on. Not counted as a preemption.
  void recompute_handoff(Sequence& s, std::span<const int32_t> bad = {});
  // Blocks found bad outside retire_kv_blocks() (a pull's checksums): retired, counted in
  // kv_blocks_retired. The sequences holding them must be recomputed or ended by the caller.
  void retire_bad_blocks(std::span<const int32_t> bad);
  void start_running(Sequence& s);
  void park(Sequence& s);  // running -> parked: its KV kept for a transfer
  const RequestTableStats& stats() const { return stats_; }
  const RequestTableOptions& options() const { return o_; }

 private:
  struct Saved {  // one chunk's sequence before the step
    Sequence* seq = nullptr;
    int64_t tokens = 0, computed = 0, target = 0, kv = -1;
    int32_t finished = 0;
    MtpSpecState spec;
    bool forked = false;
  };
  Status commit_prefill(size_t i, const float* row, const float* hidden, int64_t hidden_size,
                        Sampler& sampler);
  Status commit_verify(size_t i, const float* rows, const float* hidden, int64_t vocab,
                       int64_t hidden_size, Sampler& sampler);
  bool emit_token(Sequence& t, int32_t token, TokenDelta& d);
  Status add_resumed(EngineRequest r);
  Status fork_choices(Sequence& parent);
  static void remove_from(std::vector<Sequence*>& list, const Sequence* s);
  void insert_sorted(std::vector<Sequence*>& list, Sequence* s);

  RequestTableOptions o_;
  KvManager& kv_;
  KvStorage* storage_;
  SpeculativeStage* spec_ = nullptr;
  std::function<void(Sequence&)> on_finish_parked_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> running_, waiting_, preempted_;  // each sorted by arrival
  std::vector<Sequence*> awaiting_;                       // kAwaitingKv, arrival order
  std::vector<Sequence*> pulling_;                        // kPullingKv
  std::vector<TokenDelta> deltas_;
  std::vector<Sequence*> handoffs_;
  int64_t next_seq_ = 0, next_arrival_ = 0;
  RequestTableStats stats_;

  // The step in flight (apply .. end_step/rollback).
  const StepPlan* plan_ = nullptr;
  SchedulerInput sched_in_;
  std::vector<TokenChunk> chunks_;
  std::vector<Sequence*> chunk_seqs_;
  std::vector<Sequence*> samplers_;
  std::vector<BlockCopy> copies_;
  std::vector<Saved> saved_;
  std::vector<Sequence*> forked_;  // children made this step
  size_t deltas_before_ = 0;
};

// The choice's sampling seed: choice 0 keeps the request's, so n = 1 and the first of n agree.
uint64_t choice_seed(uint64_t seed, int32_t index);

// Why decoding stops after `token` was appended (output_len already counts it): "stop" (an
// eos id of the model unless ignore_eos, or a stop_token_id), "length" (max_tokens or the
// context's end at max_model_len), or "" to go on.
std::string finish_reason_after(const Sequence& s, int32_t token,
                                const std::vector<int32_t>& eos_ids, int64_t max_model_len);

}  // namespace xds::engine

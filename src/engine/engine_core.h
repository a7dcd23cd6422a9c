// The DP group's engine without sockets or fabric: the model (load_causal_lm), its KV
// storage and KvManager (blocks and prefix cache), the request table, the scheduler, the
// sampler and the speculative stage. One step plans (the pure schedule()), runs the forward,
// commits and leaves the step's TokenDelta's. `xdeepserve generate` drives it directly in
// one process; the DP group's loop (engine/dp_group.cc) drives it between its sockets and
// step sync, calling plan() and execute() separately (the instance's groups agree on whether
// to run in between).
//
// A step that fails (the forward, the commit, or the groups' agreement on it) is rolled back
// (RequestTable::rollback) before its error is returned: no token of it is emitted and every
// sequence is as before. With expert parallelism a transient exchange error comes back as
// Abandoned on every group (engine/ep_moe_exchange.h), and the DP group runs the step again.
//
// Thread-safety: not thread-safe; one thread creates and steps it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/kv_manager.h"
#include "engine/request_table.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/causal_lm.h"
#include "model/kv_storage.h"
#include "protocol/payloads.h"

namespace xds::engine {

class SpeculativeStage;

// The KV planes' memory for `shape` (e.g. a region exported to decode groups).
using KvStorageFactory =
    std::function<Result<KvStorage>(const KvStorageShape& shape, const std::string& kv_format)>;

// Sees a step's forward before its commit: the chunks run (batch order) and their output
// (StepOutput::logits rows as RequestTable::commit reads them). An error fails the step
// (it is rolled back). `generate` checks the logits are finite and writes --dump-logits here.
using AfterForwardFn =
    std::function<Status(std::span<const TokenChunk> chunks, const StepOutput& out)>;

// Runs after a step's commit, before the step ends: with expert parallelism, every group's
// agreement that the step stands (EpMoeExchange::agree_step). An error fails the step (it is
// rolled back, its tokens with it).
using StepAgreementFn = std::function<Status()>;

struct EngineCoreOptions {
  std::string model_dir;
  ModelOptions model;                     // compute dtype, KV dtype, threads per device
  int32_t max_num_seqs = 256;             // requests holding KV at once
  int32_t max_num_batched_tokens = 2048;  // tokens per step (decodes + prefill chunks)
  bool chunked_prefill = true;
  bool prefix_cache = true;
  int64_t kv_memory_bytes = 0;  // KV planes (> 0: at least one block)
  int64_t kv_tokens = 0;        // > 0: KV planes for this many tokens instead (whole blocks)
  int64_t block_size = 16;
  int64_t max_model_len = 0;           // 0: the model's max_position_embeddings
  int64_t valid_vocab = 0;             // ids that can be sampled (0: the model's vocab_size)
  int64_t speculative_tokens = 0;      // MTP drafts per decode step (0: off)
  int64_t speculative_mtp_layers = 0;  // MTP layers the drafts use (0: all the model has)
  bool park_prefill_only = false;      // RequestTableOptions::park_prefill_only
  bool all_logits = false;             // RequestTableOptions::all_logits
  KvStorageFactory kv_storage;         // null: KvStorage::create
  AfterForwardFn after_forward;        // null: none
};

class EngineCore {
 public:
  // Loads the model and sizes the KV cache. The errors of load_causal_lm; InvalidArgument
  // when kv_memory_bytes holds no block, or for --speculative-* values the model cannot serve.
  static Result<std::unique_ptr<EngineCore>> create(const EngineCoreOptions& options);
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  const ModelInfo& info() const { return model_->info(); }

  // A request (its prompt tokenized); InvalidArgument for an id already held.
  Status add_request(EngineRequest r);
  // Stops choice `index` of request `id` (-1: every choice); its final delta says "abort".
  void cancel(const std::string& id, int32_t index);
  bool has_work() const { return table_->has_work(); }

  // One whole step: releases finished requests, plans, runs the forward and commits; the
  // step's deltas are appended to *deltas. Nothing to do: no forward, no delta.
  Status step(std::vector<TokenDelta>* deltas);

  // The step in parts (the DP group's loop). plan(): the step's plan, without changing
  // anything. execute(): applies the last plan (or, with no work, runs an empty step), runs
  // the forward and the commit; `lockstep` runs the MTP passes even without rows (expert
  // parallelism). The deltas collect in deltas() until the caller takes them.
  Status plan();
  const StepPlan& planned() const { return plan_; }
  Status execute(bool lockstep);
  std::vector<TokenDelta>& deltas() { return table_->deltas(); }

  // Called from inside a step: after the main forward, and between the model's layers
  // (CausalLm::set_layer_callback) at most every kHeartbeatPeriodNs, so a long step (a big
  // prefill chunk) still answers. The DP group answers heartbeats with it; `fn` must not call
  // into the model.
  static constexpr int64_t kHeartbeatPeriodNs = 10'000'000;
  void set_heartbeat(std::function<void()> fn);
  // See StepAgreementFn; null: none (one group alone).
  void set_step_agreement(StepAgreementFn fn) { agree_ = std::move(fn); }

  CausalLm& model() { return *model_; }
  KvStorage& storage() { return *storage_; }
  KvManager& kv() { return *kv_; }
  RequestTable& table() { return *table_; }
  const RequestTable& table() const { return *table_; }
  SpeculativeStage* speculative() { return spec_.get(); }  // null: off
  int64_t max_model_len() const { return max_model_len_; }
  int64_t valid_vocab() const { return valid_vocab_; }
  int64_t block_size() const { return o_.block_size; }
  const std::string& kv_format() const { return kv_format_; }
  int64_t kv_block_bytes() const { return block_bytes_; }
  int64_t steps() const { return steps_; }

 private:
  // Out of line: SpeculativeStage is incomplete here.
  explicit EngineCore(const EngineCoreOptions& options);
  Status init();

  EngineCoreOptions o_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<KvStorage> storage_;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<SpeculativeStage> spec_;
  std::unique_ptr<RequestTable> table_;
  Sampler sampler_;
  int64_t max_model_len_ = 0;
  int64_t valid_vocab_ = 0;
  int64_t block_bytes_ = 0;
  std::string kv_format_;
  std::function<void()> heartbeat_;
  StepAgreementFn agree_;
  int64_t heartbeat_last_ns_ = 0;  // steady clock of the last between-layers call
  StepPlan plan_;
  StepOutput out_;
  int64_t steps_ = 0;
};

}  // namespace xds::engine

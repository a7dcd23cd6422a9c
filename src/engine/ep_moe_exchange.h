// EpMoeExchange: the routed experts of every MoE layer spread over the devices of an instance
// (expert parallelism, EP = N), dispatched and combined over XCCL (xccl/moe.h).
//
// Each device holds E / N + S expert slots per MoE layer (S spare slots per device, empty
// until EPLB fills them; docs/design/architecture.md, "Experts are addressed through a
// map"); an expert map per MoE layer (the MTP layers included), all under one version,
// says which slot serves each logical expert. The identity map puts logical expert e on device e / (E / N), slot
// e % (E / N); the device computes only its own slots (slot -> logical id -> the mapped
// weights, shared read-only with the model).
//
// run() (one MoE layer of the step, the MoeExchange interface):
//   for each round of at most max_tokens of this device's tokens (a device with no tokens
//   still joins every round until no device has more):
//     1. x rows -> the exchange's input staging, as f32 (ComputeDType::kF32: the reference,
//        bit for bit) or rounded to bf16 (kBF16: the expert products round their inputs
//        anyway);
//     2. dispatch (routes through the layer's map; receivers check every sender's version; an
//        expert with several copies serves the token of row i of in.x by spread_key(i, rank),
//        engine/eplb_maps.h);
//     3. this device's slots run on the rows it received (GroupedExperts, f32 out);
//     4. combine: each expert side pre-sums per (token, source) in f32 and the source sums one
//        vector per (token, device) in ascending device order; vectors are f32 (kF32) or bf16
//        (kBF16), the result lands in in.out as f32.
//   With f32 both ways the result equals LocalMoeExchange's up to the summation order.
//   W8A8 experts with EpMoeOptions::int8_rows: step 1 quantizes each row once (the rule
//   the local W8A8 experts apply to the same f32 rows: the same integers and scales), the
//   rows travel and reach the expert GEMM as INT8, so the expert outputs are the local
//   run's bits and again only the combine's summation order differs.
//
// Collective keys: collective_key(epoch, step, attempt, layer, phase), phase = pass << 8 |
// round, where pass counts this layer's run() calls since set_step() (MTP draft passes of one
// step reuse a layer) and round < 256. The engine calls set_step(epoch, step, attempt) before
// each forward, with the step and attempt every device agreed on (step_sync.h), so all
// devices present the same keys.
//
// Step attempts (transient errors, xccl/mailbox.h "Abandoning a step attempt"): set_step()
// makes the mailbox watch the attempt. When this device's exchange cannot go on -- a
// transport operation failed, or fail_next_exchange() armed an injected fault -- or a peer's
// abort marker ends one of its waits, run() (or agree_step()) gives the attempt up together
// with every device (xccl::Exchange::abandon: every device stops, the sequence numbers are
// re-read) and returns Abandoned: the step is rolled back everywhere (EngineCore) and run
// again as attempt + 1, whose keys differ. agree_step(), after the step's last exchange,
// makes sure no device keeps a step that another abandons. Any other error (a poisoned
// epoch: a dead or silent peer, a failure while abandoning) stays permanent.
//
// Staging: staging_bytes() per arena (ArenaConfig::staging_bytes at least that; the exchange
// sits at the start of the staging area).
//
// Thread-safety: one run() at a time, on the device's collective thread (the Mailbox is not
// thread-safe); the copy and expert work use the model's pool. The model and the mailbox must
// outlive the exchange.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/causal_lm.h"
#include "model/compute_dtype.h"
#include "model/grouped_experts.h"
#include "model/moe_exchange.h"
#include "model/moe_weights.h"
#include "xccl/expert_map.h"
#include "xccl/mailbox.h"
#include "xccl/moe.h"

namespace xds::engine {

struct EpMoeOptions {
  int redundant_slots = 0;      // S: spare expert slots per device and MoE layer
  int max_tokens = 256;         // tokens per device per round (staging is sized by it)
  int64_t timeout_ms = 30'000;  // a peer silent this long poisons the epoch
  // W8A8 experts (every routed expert of the model int8): each device quantizes its own
  // tokens once (kernels::quantize_row_int8, from the f32 rows), dispatch carries them as
  // INT8 and the expert GEMM takes them as they are (MoeConfig::int8_to_experts; nothing
  // dequantized on arrival, nothing quantized again per expert). The staging keeps room for
  // the INT8 rows whenever this is set (staging_bytes); float experts ignore it. false (the
  // default, so that staging_bytes stays exact for float models): rows as row_dtype, each
  // W8A8 expert quantizing its rows itself.
  bool int8_rows = false;
};

// The model side is a CausalLm: its info (experts, top-k, MoE layers), compute dtype, pool
// and moe_weights(). The routed-expert weights are mmap'd and shared read-only; the slots
// bind only this device's experts.
struct EpMoeSetup {
  CausalLm* model = nullptr;
  xccl::Mailbox* mailbox = nullptr;  // the device's mailbox; world = every device of the EP group
  EpMoeOptions options;
};

class EpMoeExchange final : public MoeExchange {
 public:
  // InvalidArgument when E is not divisible by the device count, options are out of range,
  // or the arena's staging is smaller than staging_bytes().
  static Result<std::unique_ptr<EpMoeExchange>> create(const EpMoeSetup& setup);
  // Staging bytes per arena for an instance of `devices` devices.
  static uint64_t staging_bytes(const ModelInfo& info, int devices, ComputeDType compute,
                                const EpMoeOptions& options);
  // The exchange's MoeConfig (row and vector types from the compute dtype; slots E / N + S).
  // With options.int8_rows the INT8 staging is included (int8); create() turns
  // int8_to_experts on where the experts are W8A8.
  static xccl::MoeConfig moe_config(const ModelInfo& info, int devices, ComputeDType compute,
                                    const EpMoeOptions& options);
  // Whether the rows reach the experts as INT8 (int8_rows and W8A8 experts).
  bool int8_rows() const { return ex_->config().int8_to_experts; }

  // Before each forward: the step's (epoch, step, attempt) for the collective keys; the
  // mailbox watches the attempt from here.
  void set_step(uint32_t epoch, uint32_t step, uint32_t attempt = 0);
  // Pure: the key of (epoch, step, attempt, layer, phase): collective_key's step field is
  // step << 2 | attempt mod 4 (attempts of one step differ; kMaxStepAttempts <= 4).
  static uint64_t collective_key(uint32_t epoch, uint32_t step, uint32_t attempt, uint16_t layer,
                                 uint16_t phase);

  // After the step's last run() (the commit's MTP passes included), before its tokens count:
  // a barrier of every device under the attempt's key. Ok: every device finished the attempt;
  // Abandoned: some device gave it up (this one then gave it up too, see above); a poison
  // status otherwise (a post of the barrier that fails cannot be taken back: permanent).
  Status agree_step();

  // Fault injection (the DP group's kExchangeError fault): the first run() after the next
  // set_step() gives that step attempt up before it posts anything, as a failed transport
  // operation would: every device's step returns Abandoned, is rolled back and run again.
  // Cleared once it fired. Call on the device's collective thread, like everything here.
  void fail_next_exchange() { fail_armed_ = true; }

  // Scale-down (P119, docs/design/reliability.md): the exchange goes on over `mailbox`, whose
  // fabric holds the devices left (xccl::MemberFabric: renumbered, a new epoch). `before` and
  // `after` name the devices of the old and the new fabric by the same ids (ascending, e.g.
  // DP group numbers); every layer's map becomes scaled_down_map(map, before, after)
  // (engine/eplb_maps.h): the copies on lost devices dropped, the others renumbered. The
  // slots, their weights and the redundant copies stay as they are. InvalidArgument, with
  // nothing changed, for an expert left without a copy. With identity_version > 0 (a group
  // rejoined: every device of the instance is back) the maps are the identity at that
  // version instead. Call between steps, on every device of the new fabric, each having left
  // the old one.
  Status reform(xccl::Mailbox& mailbox, std::span<const int> before, std::span<const int> after,
                uint64_t identity_version = 0);

  // Replaces every MoE layer's map: maps[l] for every layer index l (MTP layers included;
  // entries of dense layers are ignored), all MoE layers under one version. Call at a step
  // boundary, with the version every device agreed on (step_sync.h). InvalidArgument for a
  // map of the wrong shape or mixed versions; the maps in force then stay.
  // A redundant slot (index >= E / N) that a map fills is bound to the weights given by
  // set_redundant_slot for that (layer, slot) and expert, never to anything else: a map that
  // names a redundant slot holding another expert (or nothing) is InvalidArgument.
  Status set_expert_maps(std::vector<xccl::ExpertMap> maps);
  // Declares what redundant slot `slot` (in [E / N, E / N + S)) of `layer` holds: `logical`'s
  // weights at `weights` (owned by the caller, alive while bound), or nothing (logical -1).
  // Call only while no map in force uses that slot (the caller's EPLB protocol).
  Status set_redundant_slot(int64_t layer, int slot, int logical, const MlpWeights* weights);
  const std::vector<xccl::ExpertMap>& expert_maps() const { return maps_; }
  uint64_t map_version() const { return map_version_; }
  // Layer indices (MTP layers included) that are MoE layers, ascending.
  const std::vector<int64_t>& moe_layers() const { return moe_layers_; }
  int slots_per_device() const { return slots_; }
  int rank() const { return setup_.mailbox->fabric().rank(); }
  // Token-expert pairs this device's slots computed, cumulative: [moe_layers().size(), slots]
  // row-major (rows in moe_layers() order).
  std::span<const int64_t> slot_rows() const { return slot_rows_; }

  // One MoE layer of the step (see above). Every device must make the same sequence of calls;
  // an error before the first collective (a layer that is not MoE, a top-k other than the
  // model's, more than 16 passes of a layer since set_step) leaves the peers waiting until
  // their deadline poisons the epoch.
  Status run(const MoeExchangeInput& in) override;

  // Nanoseconds since creation in dispatch (staging the rows included), in this device's
  // experts, and in combine; waits for slower peers count where they happen.
  struct Times {
    int64_t dispatch_ns = 0, experts_ns = 0, combine_ns = 0;
    int64_t runs = 0;
  };
  const Times& times() const { return times_; }

 private:
  EpMoeExchange(const EpMoeSetup& setup, std::unique_ptr<xccl::Exchange> ex, int slots);
  const MoeWeights* moe_weights(int64_t layer) const;
  // Slot weights of one layer from `map` into `out` (nothing else changes).
  Status bind_layer(int64_t layer, const xccl::ExpertMap& map,
                    std::vector<const MlpWeights*>& out);
  Status run_round(const MoeExchangeInput& in, int64_t begin, int64_t n, bool more,
                   uint64_t key, bool first);
  // `why` (Abandoned) after every device gave the attempt up, or the error that kept this
  // device from giving it up (permanent).
  Status abandon_attempt(const Status& why);

  EpMoeSetup setup_;
  ModelInfo info_;    // the model's
  ThreadPool& pool_;  // the model's
  std::unique_ptr<xccl::Exchange> ex_;
  int slots_ = 0;
  int64_t n_layers_ = 0;                 // main + MTP layers
  std::vector<int64_t> moe_layers_;
  std::vector<xccl::ExpertMap> maps_;    // [n_layers_] (dense layers: empty)
  std::vector<std::vector<const MlpWeights*>> slot_weights_;  // [n_layers_][slots]
  uint64_t map_version_ = 0;
  GroupedExperts experts_;
  std::vector<uint16_t> pass_;           // [n_layers_] run() calls since set_step
  uint32_t epoch_ = 0, step_ = 0, attempt_ = 0;
  bool fail_armed_ = false;  // fail_next_exchange(): armed for the next set_step()
  bool fail_step_ = false;   // this step attempt's first run() gives it up
  std::vector<float> expert_out_;        // [n_rows, D] f32 (kBF16 vectors: rounded after)
  std::vector<uint16_t> out16_;          // [max_tokens, D] bf16 combine output (kBF16)
  std::vector<int32_t> logical_;         // [slots] scratch of bind_layer
  std::vector<int64_t> moe_row_;         // [n_layers_] row of a MoE layer in slot_rows_, or -1
  std::vector<int64_t> slot_rows_;       // [moe layers, slots] cumulative
  // [n_layers_][S]: what each redundant slot holds (expert, weights); expert -1: nothing.
  std::vector<std::vector<std::pair<int, const MlpWeights*>>> redundant_;
  std::vector<uint32_t> spread_;         // [max_tokens] spread keys of a round
  std::vector<int> peers_;               // every other device (agree_step)
  Times times_;
};

}  // namespace xds::engine

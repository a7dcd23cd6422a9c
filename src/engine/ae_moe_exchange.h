// AeMoeExchange: the attention side of MoE/attention disaggregation (P105–P111,
// docs/design/ae_disaggregation.md). An attention DP group runs embedding, attention, dense
// layers, router, shared experts and lm_head; each MoE layer's routed experts live on the
// expert devices (engine/expert_device.h) and are reached over A2E/E2A (xccl/a2e.h).
//
// run() (one MoE layer of the step, the MoeExchange interface):
//   the layer's n tokens split into M microbatches (microbatch_bounds, engine/ae_schedule.h),
//   each into R rounds of at most max_tokens rows; R is the same on every group of the
//   instance (from the step's largest group, set_step), a group with fewer rows sending empty
//   rounds. Units (microbatch, round) in order go out two deep:
//     send(u0); send(u1); recv(u0); send(u2); recv(u1); ...
//   so the next unit's rows are at the trampoline while the experts compute the current one
//   (the trampoline's input and e2a staging are single buffers: a third unit in flight would
//   wait on a release that waits on it); one deep without trampoline (the domain's Exchange
//   keeps one round's routes on the sender, A2e::max_in_flight). Rows travel as f32 (ComputeDType::kF32, the
//   reference: the result equals LocalMoeExchange's up to the summation order) or bf16.
//   Key of unit (m, r): a2e_key(epoch, step, layer, domain, ae_round_code(m, r)).
//
// Step notices (kAeStep): the expert devices need no controller. Before each step that runs
// (and once at the end) attention rank 0 posts a notice to every expert device: what to do
// (run or stop), the step and R. The expert loop waits for it with no deadline (sleeping in
// the fabric's back-off), then follows the pure turn order (ae_expert_turns) alone.
//
// Thread-safety: the device's collective thread only (the Mailbox is not thread-safe); the
// model and the mailbox must outlive the exchange.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "engine/ae_schedule.h"
#include "engine/step_sync.h"
#include "model/causal_lm.h"
#include "model/moe_exchange.h"
#include "xccl/a2e.h"
#include "xccl/mailbox.h"

namespace xds::engine {

struct AeOptions {
  AeShape shape;
  int max_tokens = 256;           // rows per attention group per round (staging sized by it)
  int64_t timeout_ms = 600'000;   // a peer silent this long poisons the epoch
  std::string trace_dir;          // expert devices: where expert<k>.json goes ("": nowhere)
  // false: no trampoline forwarding (for comparison): each attention group routes its rows
  // and sends them to every expert device itself (xccl::A2eTopology::trampoline).
  bool trampoline = true;
};

// The A2e topology of these options (ae_topology plus the trampoline switch).
xccl::A2eTopology ae_a2e_topology(const AeOptions& options);
// The expert map of an A/E instance (every MoE layer): the identity over X devices of
// ceil(E / X) slots.
xccl::ExpertMap ae_expert_map(const ModelInfo& info, const AeOptions& options);

// A/E: the options of an instance of `shape` whose groups batch at most
// max_num_batched_tokens (rows per round clamped to [16, 512]), and the staging bytes each
// device's arena needs for A2E/E2A. InvalidArgument naming the flags for a shape that cannot
// run, or a model with no MoE layers.
AeOptions ae_options(const AeShape& shape, int32_t max_num_batched_tokens);
Result<uint64_t> ae_staging_bytes(const std::string& model_dir, const ModelOptions& model,
                                  const AeOptions& options);

// The A2E exchange's config, the same on every device of the instance.
xccl::MoeConfig ae_moe_config(const ModelInfo& info, ComputeDType compute,
                              const AeOptions& options);
// Staging bytes per arena of an A/E instance.
uint64_t ae_staging_bytes(const ModelInfo& info, ComputeDType compute, const AeOptions& options);
// The layer of the step notice's key (MoE layers use 0 .. 4094; step headers 0xFFF).
inline constexpr uint16_t kAeNoticeLayer = 0xFFD;
// Rounds per microbatch for a step whose largest group runs `max_group_tokens` tokens.
int ae_rounds(int64_t max_group_tokens, int microbatches, int max_tokens);

// The step notice (one MailWords): w0 kind (1 run, 2 stop, 3 abort), w1 step, w2 rounds.
struct AeStepNotice {
  enum Kind : uint64_t { kRun = 1, kStop = 2, kAbort = 3 };
  uint64_t kind = kRun;
  uint64_t step = 0;
  int rounds = 1;
};
uint64_t ae_notice_key(uint32_t epoch, uint64_t step);

class AeMoeExchange final : public MoeExchange {
 public:
  // InvalidArgument for a device that is not an attention group of `options.shape`, or a
  // staging too small.
  static Result<std::unique_ptr<AeMoeExchange>> create(CausalLm& model, xccl::Mailbox& mailbox,
                                                       const AeOptions& options);
  // Before each forward: the step and the largest group's tokens (StepDecision::max_tokens).
  void set_step(uint32_t epoch, uint32_t step, int64_t max_group_tokens);
  // Attention rank 0 only: posts the notice to every expert device.
  Status notify_experts(const AeStepNotice& notice);
  // The same for a step decision: run (with its rounds), stop or abort; nothing for skip and
  // sleep (the expert devices keep waiting for the next step).
  Status notify_experts(const StepDecision& decision);

  Status run(const MoeExchangeInput& in) override;

  struct Times {
    int64_t a2e_ns = 0, e2a_ns = 0;  // in sends (staging included) and in receives
    int64_t runs = 0;
  };
  const Times& times() const { return times_; }

 private:
  AeMoeExchange(CausalLm& model, xccl::Mailbox& mb, const AeOptions& o,
                std::unique_ptr<xccl::A2e> a2e);
  Status send_unit(const MoeExchangeInput& in, int64_t begin, int64_t n, bool more,
                   uint64_t key);
  Status recv_unit(const MoeExchangeInput& in, int64_t begin, int64_t n, uint64_t key);

  CausalLm& model_;
  xccl::Mailbox& mb_;
  AeOptions o_;
  std::unique_ptr<xccl::A2e> a2e_;
  xccl::MoeConfig cfg_;
  xccl::ExpertMap map_;  // routes the rows without trampoline
  int domain_ = 0;
  uint32_t epoch_ = 0, step_ = 0;
  int rounds_ = 1;
  std::vector<uint8_t> ran_;     // [layers] run() calls since set_step (one pass each)
  std::vector<uint16_t> out16_;  // [max_tokens, hidden] bf16 vectors (bf16 mode)
  Times times_;
};

}  // namespace xds::engine

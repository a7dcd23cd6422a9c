#include "engine/ae_moe_exchange.h"

#include <algorithm>
#include <cstring>

#include "base/clock.h"
#include "kernels/cpu/linear.h"
#include "model/registry.h"
#include "xccl/rowops.h"

namespace xds::engine {
namespace {

int max_domain_size(const AeShape& s) {
  const std::vector<int> first = ae_domain_starts(s);
  int m = 0;
  for (size_t d = 0; d + 1 < first.size(); ++d) m = std::max(m, first[d + 1] - first[d]);
  return m;
}

}  // namespace

xccl::MoeConfig ae_moe_config(const ModelInfo& info, ComputeDType compute,
                              const AeOptions& options) {
  const xccl::RowDType t =
      compute == ComputeDType::kF32 ? xccl::RowDType::kF32 : xccl::RowDType::kBf16;
  const int x = std::max(options.shape.experts, 1);
  xccl::MoeConfig m;
  m.hidden = int(info.hidden_size);
  m.topk = int(info.experts_per_token);
  m.max_tokens = options.max_tokens;
  // X need not divide E: ceil(E / X) slots per device, the last devices' tail slots empty
  // (ExpertMap::identity).
  m.slots_per_device = int((info.n_routed_experts + x - 1) / x);
  m.timeout_ms = options.timeout_ms;
  m.row_dtype = t;
  m.vector_dtype = t;
  m.contiguous_rows = true;  // GroupedExperts gathers every row from one array
  return m;
}

xccl::A2eTopology ae_a2e_topology(const AeOptions& options) {
  xccl::A2eTopology t = ae_topology(options.shape);
  t.trampoline = options.trampoline;
  return t;
}

xccl::ExpertMap ae_expert_map(const ModelInfo& info, const AeOptions& options) {
  const int x = std::max(options.shape.experts, 1);
  return xccl::ExpertMap::identity(int(info.n_routed_experts), x,
                                   int((info.n_routed_experts + x - 1) / x), 1);
}

uint64_t ae_staging_bytes(const ModelInfo& info, ComputeDType compute, const AeOptions& options) {
  const xccl::MoeConfig c = ae_moe_config(info, compute, options);
  const xccl::A2eLayout l = xccl::a2e_layout(c, ae_a2e_topology(options), 0);
  (void)max_domain_size;
  return std::max<uint64_t>(l.end + (uint64_t{1} << 16), uint64_t{1} << 20);
}

int ae_rounds(int64_t max_group_tokens, int microbatches, int max_tokens) {
  const std::vector<int64_t> b = microbatch_bounds(max_group_tokens, microbatches);
  const int64_t largest = b[1] - b[0];  // the first microbatch is the largest
  return int(std::max<int64_t>(1, (largest + max_tokens - 1) / max_tokens));
}

uint64_t ae_notice_key(uint32_t epoch, uint64_t step) {
  return xccl::collective_key(epoch, uint32_t(step), kAeNoticeLayer, 0);
}

AeOptions ae_options(const AeShape& shape, int32_t max_num_batched_tokens) {
  AeOptions o;
  o.shape = shape;
  o.max_tokens = std::clamp(max_num_batched_tokens, 16, 512);
  o.timeout_ms = 600'000;  // a peer's long prefill chunk is not a dead peer
  return o;
}

Result<uint64_t> ae_staging_bytes(const std::string& model_dir, const ModelOptions& model,
                                  const AeOptions& options) {
  XDS_RETURN_IF_ERROR(validate_ae_shape(options.shape));
  XDS_ASSIGN_OR_RETURN(const ModelInfo info, load_model_info(model_dir));
  if (info.moe_layers.empty()) {
    return invalid_argument(
        "--expert-devices {}: expert devices hold the routed experts of the MoE layers, and "
        "the model in {} ({}) has no MoE layers",
        options.shape.experts, model_dir, info.model_type);
  }
  return ae_staging_bytes(info, model.compute, options);
}

Result<std::unique_ptr<AeMoeExchange>> AeMoeExchange::create(CausalLm& model,
                                                             xccl::Mailbox& mailbox,
                                                             const AeOptions& options) {
  XDS_RETURN_IF_ERROR(validate_ae_shape(options.shape));
  const int rank = mailbox.fabric().rank();
  if (ae_domain_of(options.shape, rank) < 0)
    return invalid_argument("A/E: rank {} is not one of the {} attention groups", rank,
                            options.shape.attention);
  if (mailbox.fabric().world_size() != ae_world_size(options.shape))
    return invalid_argument("A/E: the fabric has {} devices, {} attention + {} expert expected",
                            mailbox.fabric().world_size(), options.shape.attention,
                            options.shape.experts);
  const xccl::MoeConfig c = ae_moe_config(model.info(), model.compute_dtype(), options);
  XDS_ASSIGN_OR_RETURN(auto a2e,
                       xccl::A2e::create(mailbox, c, ae_a2e_topology(options), &model.pool()));
  std::unique_ptr<AeMoeExchange> e(new AeMoeExchange(model, mailbox, options, std::move(a2e)));
  e->cfg_ = c;
  e->map_ = ae_expert_map(model.info(), options);
  return e;
}

AeMoeExchange::AeMoeExchange(CausalLm& model, xccl::Mailbox& mb, const AeOptions& o,
                             std::unique_ptr<xccl::A2e> a2e)
    : model_(model), mb_(mb), o_(o), a2e_(std::move(a2e)) {
  domain_ = ae_domain_of(o.shape, mb.fabric().rank());
  ran_.assign(size_t(model.info().num_layers + model.info().n_mtp_layers), 0);
}

void AeMoeExchange::set_step(uint32_t epoch, uint32_t step, int64_t max_group_tokens) {
  epoch_ = epoch;
  step_ = step;
  rounds_ = ae_rounds(max_group_tokens, o_.shape.microbatches, cfg_.max_tokens);
  std::fill(ran_.begin(), ran_.end(), uint8_t(0));
}

Status AeMoeExchange::notify_experts(const AeStepNotice& notice) {
  const uint64_t key = ae_notice_key(mb_.fabric().epoch(), notice.step);
  const xccl::MailWords w{notice.kind, notice.step, uint64_t(notice.rounds), 0, 0, 0};
  for (int e = 0; e < o_.shape.experts; ++e) {
    const int to = o_.shape.attention + e;
    if (mb_.post(to, xccl::Channel::kAeStep, key, w) == xccl::OpState::kFailed)
      return unavailable("A/E: the step {} notice to expert device {} could not be written",
                         notice.step, to);
  }
  return Status::ok_status();
}

Status AeMoeExchange::notify_experts(const StepDecision& decision) {
  AeStepNotice n;
  n.step = decision.step;
  switch (decision.action) {
    case StepAction::kRun:
      n.kind = AeStepNotice::kRun;
      n.rounds = ae_rounds(decision.max_tokens, o_.shape.microbatches, o_.max_tokens);
      break;
    case StepAction::kStop:
      n.kind = AeStepNotice::kStop;
      break;
    case StepAction::kAbort:
      n.kind = AeStepNotice::kAbort;
      break;
    default:
      return Status::ok_status();
  }
  return notify_experts(n);
}

Status AeMoeExchange::send_unit(const MoeExchangeInput& in, int64_t begin, int64_t n, bool more,
                                uint64_t key) {
  const int64_t t0 = now_ns();
  const int64_t d = cfg_.hidden, k = cfg_.topk;
  // Rows [n, D] into the staging: f32 as they are, or rounded to bf16.
  XDS_ASSIGN_OR_RETURN(std::byte * stage, a2e_->input_data());
  if (n > 0) {
    const float* x = in.x + begin * d;
    if (cfg_.row_dtype == xccl::RowDType::kF32)
      std::memcpy(stage, x, sizeof(float) * size_t(n * d));
    else
      kernels::round_to_bf16(x, n * d, reinterpret_cast<uint16_t*>(stage));
  }
  const std::span<const int32_t> ids(in.ids + begin * k, size_t(n * k));
  const std::span<const float> w(in.weights + begin * k, size_t(n * k));
  XDS_RETURN_IF_ERROR(a2e_->a2e_send(int(n), ids, w, key, more, &map_));
  times_.a2e_ns += now_ns() - t0;
  return Status::ok_status();
}

Status AeMoeExchange::recv_unit(const MoeExchangeInput& in, int64_t begin, int64_t n,
                                uint64_t key) {
  const int64_t t0 = now_ns();
  const int64_t d = cfg_.hidden;
  if (cfg_.vector_dtype == xccl::RowDType::kF32) {
    XDS_RETURN_IF_ERROR(a2e_->e2a_recv(in.out + begin * d, key));
  } else {
    if (out16_.size() < size_t(cfg_.max_tokens * d)) out16_.resize(size_t(cfg_.max_tokens * d));
    XDS_RETURN_IF_ERROR(a2e_->e2a_recv(out16_.data(), key));
    float* o = in.out + begin * d;
    for (int64_t i = 0; i < n * d; ++i) o[i] = xccl::bf16_to_float(out16_[size_t(i)]);
  }
  times_.e2a_ns += now_ns() - t0;
  return Status::ok_status();
}

Status AeMoeExchange::run(const MoeExchangeInput& in) {
  if (in.layer < 0 || in.layer >= int64_t(ran_.size()))
    return invalid_argument("A/E: layer {} outside the model's {} layers", in.layer, ran_.size());
  if (in.top_k != cfg_.topk || in.n < 0)
    return invalid_argument("A/E: layer {}: top-k {} (exchange {}), n {}", in.layer, in.top_k,
                            cfg_.topk, in.n);
  if (ran_[size_t(in.layer)]++ > 0)
    return unimplemented("A/E: layer {} ran twice in step {} (MTP passes are not served yet)",
                         in.layer, step_);
  struct Unit {
    int64_t begin, n;
    bool more;
    uint64_t key;
  };
  const int M = o_.shape.microbatches, T = cfg_.max_tokens;
  const std::vector<int64_t> b = microbatch_bounds(in.n, M);
  std::vector<Unit> units;
  units.reserve(size_t(M * rounds_));
  for (int m = 0; m < M; ++m) {
    const int64_t size = b[size_t(m) + 1] - b[size_t(m)];
    if (size > int64_t(rounds_) * T)
      return internal_error("A/E: microbatch {} of layer {} has {} rows, more than {} rounds of {}",
                            m, in.layer, size, rounds_, T);
    for (int r = 0; r < rounds_; ++r) {
      const int64_t begin = std::min<int64_t>(size, int64_t(r) * T);
      const int64_t n = std::min<int64_t>(size - begin, T);
      units.push_back(Unit{b[size_t(m)] + begin, n, r + 1 < rounds_,
                           xccl::a2e_key(epoch_, step_, uint16_t(in.layer), domain_,
                                         ae_round_code(m, r))});
    }
  }
  // Two units in flight where the A2e allows it: send(u0) send(u1) recv(u0) send(u2) recv(u1)
  // ...; one otherwise (no trampoline): send(u0) recv(u0) send(u1) recv(u1) ...
  const size_t depth = size_t(a2e_->max_in_flight());
  for (size_t u = 0; u < std::min(depth, units.size()); ++u)
    XDS_RETURN_IF_ERROR(send_unit(in, units[u].begin, units[u].n, units[u].more, units[u].key));
  // The shared experts (the model's overlap work) run here while the routed ones are away.
  if (in.overlap != nullptr)
    while (in.overlap->run_slice() != OverlapWork::Slice::kDone) {
    }
  for (size_t u = 0; u < units.size(); ++u) {
    XDS_RETURN_IF_ERROR(recv_unit(in, units[u].begin, units[u].n, units[u].key));
    if (u + depth < units.size()) {
      const Unit& nx = units[u + depth];
      XDS_RETURN_IF_ERROR(send_unit(in, nx.begin, nx.n, nx.more, nx.key));
    }
  }
  ++times_.runs;
  return Status::ok_status();
}

}  // namespace xds::engine

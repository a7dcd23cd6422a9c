#include "engine/ep_moe_exchange.h"

#include <algorithm>
#include <cstring>

#include "base/clock.h"
#include "base/log.h"
#include "engine/eplb_maps.h"
#include "engine/step_sync.h"
#include "kernels/cpu/int8_quant.h"
#include "kernels/cpu/linear.h"
#include "model/int8_mlp.h"
#include "tensor/dtype.h"
#include "xccl/rowops.h"

namespace xds::engine {
namespace {

constexpr int kMaxPasses = 16;   // 4 bits of the key's phase
constexpr int kMaxRounds = 256;  // 8 bits of the key's phase
// The key's layer field of agree_step()'s barrier (MoE layers use 0 .. 4094; the step
// headers 0xFFF, step_sync.h).
constexpr uint16_t kAgreeLayer = 0xFFE;
static_assert(kMaxStepAttempts <= 4, "collective_key tells 4 attempts of a step apart");

int64_t total_layers(const ModelInfo& i) {
  return i.num_layers + i.n_mtp_layers;
}

}  // namespace

xccl::MoeConfig EpMoeExchange::moe_config(const ModelInfo& info, int devices,
                                          ComputeDType compute, const EpMoeOptions& options) {
  const xccl::RowDType t =
      compute == ComputeDType::kF32 ? xccl::RowDType::kF32 : xccl::RowDType::kBf16;
  xccl::MoeConfig m;
  m.hidden = int(info.hidden_size);
  m.topk = int(info.experts_per_token);
  m.max_tokens = options.max_tokens;
  m.slots_per_device =
      devices > 0 ? int(info.n_routed_experts / devices) + options.redundant_slots : 0;
  m.timeout_ms = options.timeout_ms;
  m.row_dtype = t;
  m.vector_dtype = t;
  m.contiguous_rows = true;  // GroupedExperts gathers every row from one array
  m.int8 = options.int8_rows;
  return m;
}

uint64_t EpMoeExchange::staging_bytes(const ModelInfo& info, int devices, ComputeDType compute,
                                      const EpMoeOptions& options) {
  return xccl::moe_staging_bytes(moe_config(info, devices, compute, options), devices);
}

Result<std::unique_ptr<EpMoeExchange>> EpMoeExchange::create(const EpMoeSetup& setup) {
  if (setup.mailbox == nullptr || setup.model == nullptr)
    return invalid_argument("EpMoeExchange: a mailbox and a model are required");
  const ModelInfo& c = setup.model->info();
  const ComputeDType compute = setup.model->compute_dtype();
  ThreadPool& pool = setup.model->pool();
  const EpMoeOptions& o = setup.options;
  xccl::Fabric& f = setup.mailbox->fabric();
  const int n = f.world_size();
  if (c.n_routed_experts < 1 || c.n_routed_experts % n != 0)
    return invalid_argument(
        "expert parallelism: n_routed_experts {} must be a positive multiple of the {} devices",
        c.n_routed_experts, n);
  if (o.redundant_slots < 0 || o.max_tokens < 1)
    return invalid_argument("expert parallelism: redundant_slots {} must be >= 0 and "
                            "max_tokens {} >= 1",
                            o.redundant_slots, o.max_tokens);
  if (c.experts_per_token < 1 || c.experts_per_token > xccl::kMaxTopk)
    return unimplemented("expert parallelism: {} experts per token outside [1, {}]",
                         c.experts_per_token, xccl::kMaxTopk);
  xccl::MoeConfig mc = moe_config(c, n, compute, o);
  // INT8 rows straight into the expert GEMM where every routed expert is W8A8 (the same
  // weights on every device: the same decision, the same staging layout).
  bool w8a8 = !c.moe_layers.empty();
  for (int64_t l : c.moe_layers) {
    const MoeWeights* mw = setup.model->moe_weights(l);
    if (mw == nullptr) continue;  // reported below
    for (const MlpWeights& w : mw->experts) w8a8 = w8a8 && is_int8_mlp(w);
  }
  mc.int8_to_experts = mc.int8 && w8a8;
  mc.int8 = mc.int8_to_experts;  // float experts: no INT8 on the wire (the staging keeps room)
  xccl::ExchangeRoles roles;
  for (int r = 0; r < n; ++r) {
    roles.senders.push_back(r);
    roles.receivers.push_back(r);
  }
  roles.staging_base = f.layout().staging;
  XDS_ASSIGN_OR_RETURN(auto ex, xccl::Exchange::create(*setup.mailbox, mc, roles, &pool));
  std::unique_ptr<EpMoeExchange> e(new EpMoeExchange(setup, std::move(ex), mc.slots_per_device));
  for (int64_t l : e->moe_layers_)
    if (l < 0 || l >= e->n_layers_ || e->moe_weights(l) == nullptr)
      return invalid_argument("EpMoeExchange: MoE layer {} has no routed-expert weights", l);
  std::vector<xccl::ExpertMap> maps(size_t(e->n_layers_));
  for (int64_t l : e->moe_layers_)
    maps[size_t(l)] = xccl::ExpertMap::identity(int(c.n_routed_experts), n, e->slots_, 1);
  XDS_RETURN_IF_ERROR(e->set_expert_maps(std::move(maps)));
  return e;
}

EpMoeExchange::EpMoeExchange(const EpMoeSetup& setup, std::unique_ptr<xccl::Exchange> ex,
                             int slots)
    : setup_(setup),
      info_(setup.model->info()),
      pool_(setup.model->pool()),
      ex_(std::move(ex)),
      slots_(slots),
      n_layers_(total_layers(info_)),
      moe_layers_(info_.moe_layers),
      experts_(setup.model->compute_dtype(), pool_) {
  slot_weights_.resize(size_t(n_layers_));
  pass_.assign(size_t(n_layers_), 0);
  moe_row_.assign(size_t(n_layers_), -1);
  for (size_t i = 0; i < moe_layers_.size(); ++i)
    if (moe_layers_[i] >= 0 && moe_layers_[i] < n_layers_) moe_row_[size_t(moe_layers_[i])] = int64_t(i);
  slot_rows_.assign(moe_layers_.size() * size_t(slots), 0);
  const int redundant = setup.options.redundant_slots;
  redundant_.assign(size_t(n_layers_), std::vector<std::pair<int, const MlpWeights*>>(
                                           size_t(std::max(redundant, 0)), {-1, nullptr}));
  spread_.resize(size_t(setup.options.max_tokens));
  const xccl::Fabric& f = setup.mailbox->fabric();
  for (int r = 0; r < f.world_size(); ++r)
    if (r != f.rank()) peers_.push_back(r);
  out16_.resize(size_t(setup.options.max_tokens) * size_t(info_.hidden_size));
}

const MoeWeights* EpMoeExchange::moe_weights(int64_t layer) const {
  return setup_.model->moe_weights(layer);
}

Status EpMoeExchange::set_expert_maps(std::vector<xccl::ExpertMap> maps) {
  if (int64_t(maps.size()) != n_layers_)
    return invalid_argument("expert maps: {} given, the model has {} layers (MTP included)",
                            maps.size(), n_layers_);
  const int n = setup_.mailbox->fabric().world_size();
  uint64_t version = 0;
  for (int64_t l : moe_layers_) {
    const xccl::ExpertMap& m = maps[size_t(l)];
    XDS_RETURN_IF_ERROR(m.validate().with_context(fmt::format("layer {}", l)));
    if (m.n_devices != n || m.slots_per_device != slots_ ||
        m.n_logical() != info_.n_routed_experts)
      return invalid_argument(
          "expert map of layer {}: {} devices x {} slots for {} experts, the instance has {} x "
          "{} for {}",
          l, m.n_devices, m.slots_per_device, m.n_logical(), n, slots_,
          info_.n_routed_experts);
    if (l != moe_layers_.front() && m.version != version)
      return invalid_argument("expert maps: layer {} has version {}, layer {} version {}", l,
                              m.version, moe_layers_.front(), version);
    version = m.version;
  }
  // Bind every layer first: a map that names a slot not loaded changes nothing.
  std::vector<std::vector<const MlpWeights*>> bound(static_cast<size_t>(n_layers_));
  for (int64_t l : moe_layers_)
    XDS_RETURN_IF_ERROR(bind_layer(l, maps[size_t(l)], bound[size_t(l)]));
  maps_ = std::move(maps);
  map_version_ = version;
  slot_weights_ = std::move(bound);
  return Status::ok_status();
}

Status EpMoeExchange::reform(xccl::Mailbox& mailbox, std::span<const int> before,
                             std::span<const int> after, uint64_t identity_version) {
  std::vector<xccl::ExpertMap> maps(maps_.size());
  for (int64_t l : moe_layers_) {
    if (identity_version > 0) {
      maps[size_t(l)] = xccl::ExpertMap::identity(int(info_.n_routed_experts), int(after.size()),
                                                  slots_, identity_version);
      continue;
    }
    Result<xccl::ExpertMap> m = scaled_down_map(maps_[size_t(l)], before, after);
    if (!m.ok()) return m.status().with_context(fmt::format("layer {}", l));
    maps[size_t(l)] = std::move(m).value();
  }
  xccl::Fabric& f = mailbox.fabric();
  xccl::ExchangeRoles roles;
  for (int r = 0; r < f.world_size(); ++r) {
    roles.senders.push_back(r);
    roles.receivers.push_back(r);
  }
  roles.staging_base = f.layout().staging;
  XDS_ASSIGN_OR_RETURN(auto ex, xccl::Exchange::create(mailbox, ex_->config(), roles, &pool_));
  setup_.mailbox = &mailbox;
  ex_ = std::move(ex);
  peers_.clear();
  for (int r = 0; r < f.world_size(); ++r)
    if (r != f.rank()) peers_.push_back(r);
  std::fill(pass_.begin(), pass_.end(), uint16_t(0));
  fail_armed_ = fail_step_ = false;
  return set_expert_maps(std::move(maps));
}

Status EpMoeExchange::set_redundant_slot(int64_t layer, int slot, int logical,
                                         const MlpWeights* weights) {
  const int primary = slots_ - setup_.options.redundant_slots;
  if (layer < 0 || layer >= n_layers_ || moe_row_[size_t(layer)] < 0 || slot < primary ||
      slot >= slots_ || logical < -1 || logical >= info_.n_routed_experts ||
      (logical >= 0) != (weights != nullptr))
    return invalid_argument(
        "redundant slot: layer {} slot {} (redundant slots [{}, {})) expert {} weights {}",
        layer, slot, primary, slots_, logical, weights != nullptr ? "given" : "none");
  redundant_[size_t(layer)][size_t(slot - primary)] = {logical, weights};
  return Status::ok_status();
}

Status EpMoeExchange::bind_layer(int64_t layer, const xccl::ExpertMap& m,
                                 std::vector<const MlpWeights*>& out) {
  const int rank = setup_.mailbox->fabric().rank();
  const int primary = slots_ - setup_.options.redundant_slots;
  logical_.assign(size_t(slots_), -1);
  for (int e = 0; e < m.n_logical(); ++e)
    for (int32_t p : m.replicas[size_t(e)])
      if (p / slots_ == rank) logical_[size_t(p % slots_)] = e;
  // Redundant slots from what was loaded into them (set_redundant_slot), checked against the map.
  for (int s = primary; s < slots_; ++s) {
    const auto& [held, w] = redundant_[size_t(layer)][size_t(s - primary)];
    if (logical_[size_t(s)] >= 0 && logical_[size_t(s)] != held)
      return invalid_argument(
          "expert map v{} of layer {}: redundant slot {} of device {} serves expert {} but "
          "holds {}",
          m.version, layer, s, rank, logical_[size_t(s)], held);
  }
  std::vector<int32_t> primaries(logical_.begin(), logical_.begin() + primary);
  primaries.resize(size_t(slots_), -1);
  XDS_RETURN_IF_ERROR(bind_expert_slots(*moe_weights(layer), primaries, out)
                          .with_context(fmt::format("layer {}", layer)));
  for (int s = primary; s < slots_; ++s)
    if (logical_[size_t(s)] >= 0) out[size_t(s)] = redundant_[size_t(layer)][size_t(s - primary)].second;
  return Status::ok_status();
}

void EpMoeExchange::set_step(uint32_t epoch, uint32_t step, uint32_t attempt) {
  epoch_ = epoch;
  step_ = step;
  attempt_ = attempt;
  std::fill(pass_.begin(), pass_.end(), uint16_t(0));
  setup_.mailbox->watch(xccl::attempt_tag(step, attempt));
  fail_step_ = fail_armed_;
  fail_armed_ = false;
}

uint64_t EpMoeExchange::collective_key(uint32_t epoch, uint32_t step, uint32_t attempt,
                                       uint16_t layer, uint16_t phase) {
  return xccl::collective_key(epoch, (step << 2) | (attempt & 3), layer, phase);
}

Status EpMoeExchange::abandon_attempt(const Status& why) {
  XDS_LOG_WARN("expert parallelism, device {}: step {} attempt {}: {}; giving the attempt up",
               rank(), step_, attempt_, why.message());
  XDS_RETURN_IF_ERROR(ex_->abandon(xccl::attempt_tag(step_, attempt_)));
  return why;
}

Status EpMoeExchange::agree_step() {
  const xccl::WaitCtx ctx{xccl::OpKind::kBarrier,
                          xccl::deadline_after_ms(setup_.options.timeout_ms), {}};
  const Status st = xccl::barrier(*setup_.mailbox, peers_,
                                  collective_key(epoch_, step_, attempt_, kAgreeLayer, 0), ctx);
  if (st.code() == StatusCode::kAbandoned) return abandon_attempt(st);
  if (st.ok()) setup_.mailbox->watch(0);  // the attempt is over: nobody abandons it any more
  return st;
}

Status EpMoeExchange::run(const MoeExchangeInput& in) {
  if (in.layer < 0 || in.layer >= n_layers_ || slot_weights_[size_t(in.layer)].empty())
    return invalid_argument("expert parallelism: layer {} is not a MoE layer", in.layer);
  const xccl::MoeConfig& c = ex_->config();
  if (in.top_k != c.topk || in.n < 0)
    return invalid_argument("expert parallelism: layer {}: top-k {} (exchange {}), n {}",
                            in.layer, in.top_k, c.topk, in.n);
  const int rounds = xccl::rounds_needed(int(in.n), c.max_tokens);
  if (rounds > kMaxRounds)
    return invalid_argument("expert parallelism: {} tokens need {} rounds of {} (at most {})",
                            in.n, rounds, c.max_tokens, kMaxRounds);
  uint16_t& pass = pass_[size_t(in.layer)];
  if (pass >= kMaxPasses)
    return failed_precondition(
        "expert parallelism: layer {} ran {} times since set_step (epoch {}, step {})", in.layer,
        pass, epoch_, step_);
  const uint64_t key =
      collective_key(epoch_, step_, attempt_, uint16_t(in.layer), uint16_t(pass << 8));
  ++pass;
  if (fail_step_) {
    fail_step_ = false;
    return abandon_attempt(abandoned("device {}: injected exchange_error at step {} attempt {}",
                                     rank(), step_, attempt_));
  }
  for (int round = 0;; ++round) {
    const int64_t begin = std::min<int64_t>(in.n, int64_t(round) * c.max_tokens);
    const int64_t m = std::min<int64_t>(in.n - begin, c.max_tokens);
    const Status st =
        run_round(in, begin, m, begin + m < in.n, key + uint64_t(round), round == 0);
    if (st.code() == StatusCode::kAbandoned) return abandon_attempt(st);
    XDS_RETURN_IF_ERROR(st);
    if (!ex_->any_more()) break;
    if (round + 1 >= kMaxRounds)
      return internal_error("expert parallelism: a peer still has tokens after {} rounds",
                            kMaxRounds);
  }
  ++times_.runs;
  return Status::ok_status();
}

Status EpMoeExchange::run_round(const MoeExchangeInput& in, int64_t begin, int64_t n, bool more,
                                uint64_t key, bool first) {
  const xccl::MoeConfig& c = ex_->config();
  const int64_t d = c.hidden, k = c.topk;
  const bool f32 = c.row_dtype == xccl::RowDType::kF32;
  const bool int8 = c.int8_to_experts;
  const int64_t t0 = now_ns();
  // 1. This round's rows into the staging: [n, D] f32, or rounded to bf16; INT8 rows
  //    [n][int8_row_stride(D)] (values, scale at int8_row_bytes(D) - 4) quantized once here.
  if (int8) {
    XDS_ASSIGN_OR_RETURN(std::byte * q, ex_->int8_rows());
    const uint64_t stride = xccl::int8_row_stride(int(d)), at = xccl::int8_row_bytes(int(d)) - 4;
    const float* x = in.x + begin * d;
    auto rows = [&](int64_t t0_, int64_t t1_, int) {
      for (int64_t t = t0_; t < t1_; ++t) {
        std::byte* row = q + uint64_t(t) * stride;
        const float s = kernels::quantize_row_int8(x + t * d, d, reinterpret_cast<int8_t*>(row));
        std::memcpy(row + at, &s, sizeof s);
      }
    };
    if (n > 1) pool_.parallel_for(n, rows);
    else rows(0, n, 0);
  } else {
    XDS_ASSIGN_OR_RETURN(std::byte * stage, ex_->input_data());
    if (n > 0) {
      const float* x = in.x + begin * d;
      if (f32)
        std::memcpy(stage, x, sizeof(float) * size_t(n * d));
      else
        kernels::round_to_bf16(x, n * d, reinterpret_cast<uint16_t*>(stage));
    }
  }
  // 2. Dispatch.
  const std::span<const int32_t> ids(in.ids + begin * k, size_t(n * k));
  const std::span<const float> weights(in.weights + begin * k, size_t(n * k));
  // Spread keys: the token of row r of the step meets copy (r + rank) mod |copies| of a
  // replicated expert.
  const int rank = setup_.mailbox->fabric().rank();
  for (int64_t i = 0; i < n; ++i) spread_[size_t(i)] = spread_key(begin + i, rank);
  XDS_RETURN_IF_ERROR(ex_->dispatch(int(n), ids, weights, maps_[size_t(in.layer)], key, more,
                                    int8 ? xccl::SenderRows::kInt8 : xccl::SenderRows::kBf16,
                                    std::span<const uint32_t>(spread_.data(), size_t(n))));
  const int64_t t1 = now_ns();
  // 3. This device's slots over the received rows (unweighted outputs; combine weights them).
  const xccl::RecvLayout& l = ex_->received();
  const int64_t rows = l.n_rows();
  if (const int64_t row = moe_row_[size_t(in.layer)]; row >= 0) {
    int64_t* counts = slot_rows_.data() + row * slots_;
    for (int s = 0; s < slots_; ++s) counts[s] += l.expert_offset[size_t(s) + 1] - l.expert_offset[size_t(s)];
  }
  float* out = nullptr;
  if (c.vector_dtype == xccl::RowDType::kF32) {
    out = ex_->expert_out_f32();
  } else {
    if (expert_out_.size() < size_t(rows * d)) expert_out_.resize(size_t(rows * d));
    out = expert_out_.data();
  }
  GroupedExpertsInput g;
  g.slots = slot_weights_[size_t(in.layer)];
  g.offsets = l.expert_offset;
  g.rows = ex_->unit_rows();
  g.row_dtype = int8 ? DType::kI8 : f32 ? DType::kF32 : DType::kBF16;
  g.row_stride = int8 ? int64_t(ex_->unit_row_bytes()) : d;
  g.int8_scale_offset = int8 ? int64_t(xccl::int8_row_bytes(int(d))) - 4 : 0;
  g.gather = ex_->row_units().data();
  g.out = out;
  g.overlap = first ? in.overlap : nullptr;
  XDS_RETURN_IF_ERROR(experts_.run(g).with_context(fmt::format("layer {}", in.layer)));
  if (c.vector_dtype != xccl::RowDType::kF32 && rows > 0)
    kernels::round_to_bf16(out, rows * d, ex_->expert_out());
  const int64_t t2 = now_ns();
  // 4. Combine into in.out rows [begin, begin + n).
  if (c.vector_dtype == xccl::RowDType::kF32) {
    XDS_RETURN_IF_ERROR(ex_->combine(in.out + begin * d, key));
  } else {
    XDS_RETURN_IF_ERROR(ex_->combine(out16_.data(), key));
    float* o = in.out + begin * d;
    for (int64_t i = 0; i < n * d; ++i) o[i] = xccl::bf16_to_float(out16_[size_t(i)]);
  }
  const int64_t t3 = now_ns();
  times_.dispatch_ns += t1 - t0;
  times_.experts_ns += t2 - t1;
  times_.combine_ns += t3 - t2;
  return Status::ok_status();
}

}  // namespace xds::engine

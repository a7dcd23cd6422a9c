#include "engine/eplb_agent.h"

#include <algorithm>

#include "base/log.h"
#include "engine/eplb_maps.h"

namespace xds::engine {

Result<std::unique_ptr<EplbAgent>> EplbAgent::create(EplbAgentSetup setup) {
  if (setup.model == nullptr || setup.exchange == nullptr)
    return invalid_argument("EPLB agent: a model and an expert-parallel exchange are required");
  if (setup.window_ns <= 0)
    return invalid_argument("--eplb-window must be > 0 (got {} ns)", setup.window_ns);
  std::unique_ptr<EplbAgent> a(new EplbAgent());
  a->model_ = setup.model;
  a->ex_ = setup.exchange;
  a->loader_ = setup.loader ? std::move(setup.loader) : std::make_unique<CopyReplicaLoader>();
  a->slots_ = setup.redundant_slots;
  a->primary_ = a->ex_->slots_per_device() - a->slots_;
  a->window_ns_ = setup.window_ns;
  const xccl::ExpertMap* any = nullptr;
  for (int64_t l : a->ex_->moe_layers()) any = &a->ex_->expert_maps()[size_t(l)];
  if (any == nullptr) return invalid_argument("EPLB agent: the model has no MoE layers");
  a->n_devices_ = any->n_devices;
  std::vector<const MoeWeights*> layers;
  for (int64_t l : a->ex_->moe_layers()) layers.push_back(a->model_->moe_weights(l));
  XDS_ASSIGN_OR_RETURN(a->store_, ExpertSlotStore::create(layers, a->slots_));
  for (int64_t l : a->ex_->moe_layers())  // every redundant slot starts empty
    for (int s = 0; s < a->slots_; ++s)
      XDS_RETURN_IF_ERROR(a->ex_->set_redundant_slot(l, a->primary_ + s, -1, nullptr));
  a->loaded_ = a->ex_->map_version();
  return a;
}

void EplbAgent::reformed() {
  for (int64_t l : ex_->moe_layers()) n_devices_ = ex_->expert_maps()[size_t(l)].n_devices;
  drop_pending();
  loaded_ = ex_->map_version();
}

void EplbAgent::drop_pending() {
  phase_ = Phase::kIdle;
  disabled_.clear();
  final_.clear();
  want_.clear();
  store_->clear_staging();
}

std::optional<EplbReport> EplbAgent::on_command(const EplbCommand& c, int32_t group) {
  EplbReport r;
  r.group = group;
  r.version = c.version;
  switch (c.op) {
    case EplbOp::kPrepare: {
      auto fail = [&](const Status& st) {
        drop_pending();
        r.state = EplbState::kFailed;
        r.error = st.to_string();
        XDS_LOG_WARN("DP group {}: EPLB map v{} not prepared: {}", group, c.version, r.error);
        return r;
      };
      if (phase_ != Phase::kIdle)
        return fail(failed_precondition("a reconfiguration to v{} is in progress", version_));
      const uint64_t current = ex_->map_version();
      if (c.version != current + 2)
        return fail(invalid_argument("map v{} planned for v{}, v{} is in force", c.version,
                                     c.version - 2, current));
      const std::vector<int64_t>& moe = ex_->moe_layers();
      if (c.moe_layers != moe || c.replicas.size() != moe.size())
        return fail(invalid_argument("the plan covers {} MoE layers, the model has {}",
                                     c.moe_layers.size(), moe.size()));
      eplb::Shape shape;
      shape.n_experts = model_->info().n_routed_experts;
      shape.n_devices = n_devices_;
      shape.redundant_slots = slots_;
      const int64_t n_layers = model_->info().num_layers + model_->info().n_mtp_layers;
      std::vector<std::vector<std::vector<int32_t>>> primaries(moe.size(), primary_replicas(shape));
      auto fin = layer_maps(shape, n_layers, moe, c.replicas, c.version);
      if (!fin.ok()) return fail(fin.status());
      auto dis = layer_maps(shape, n_layers, moe, primaries, c.version - 1);
      if (!dis.ok()) return fail(dis.status());
      want_.assign(moe.size(), {});
      rank_ = ex_->rank();  // the map's device index
      for (size_t i = 0; i < moe.size(); ++i) {
        auto w = redundant_slot_experts(shape, rank_, c.replicas[i]);
        if (!w.ok()) return fail(w.status().with_context(fmt::format("layer {}", moe[i])));
        want_[i] = std::move(*w);
      }
      // Phase 1: prefetch the new replicas' weights into staging memory.
      for (size_t i = 0; i < moe.size(); ++i)
        for (int s = 0; s < slots_; ++s) {
          const int e = want_[i][size_t(s)];
          if (e < 0) continue;
          const MoeWeights* w = model_->moe_weights(moe[i]);
          Status st = loader_->load(*store_, int64_t(i), s, e, w->experts[size_t(e)]);
          if (!st.ok()) return fail(st.with_context(fmt::format("layer {}", moe[i])));
        }
      disabled_ = std::move(*dis);
      final_ = std::move(*fin);
      version_ = c.version;
      phase_ = Phase::kPrepared;
      r.state = EplbState::kPrepared;
      return r;
    }
    case EplbOp::kCommit:
      if (phase_ != Phase::kPrepared || c.version != version_) {
        XDS_LOG_WARN("DP group {}: EPLB commit of v{} ignored (pending v{})", group, c.version,
                     version_);
        return std::nullopt;
      }
      phase_ = Phase::kCommitted;
      loaded_ = version_ - 1;  // the disabled map needs no weights
      return std::nullopt;
    case EplbOp::kAbort:
      if (phase_ == Phase::kPrepared && c.version == version_) drop_pending();
      if (phase_ == Phase::kIdle) {
        r.state = EplbState::kAborted;
        return r;
      }
      XDS_LOG_WARN("DP group {}: EPLB abort of v{} after commit ignored", group, c.version);
      return std::nullopt;
  }
  XDS_LOG_WARN("DP group {}: unknown EPLB op {}", group, static_cast<int>(c.op));
  return std::nullopt;
}

Result<std::optional<EplbReport>> EplbAgent::at_step_boundary(uint64_t agreed, uint64_t step,
                                                              int32_t group) {
  if (phase_ == Phase::kCommitted && agreed >= version_ - 1 && ex_->map_version() == version_ - 2) {
    // Phase 2: every device switches to the disabled map at this step.
    XDS_RETURN_IF_ERROR(ex_->set_expert_maps(disabled_));
    disable_step_ = step;
    // Phase 3: no map in force uses a redundant slot now: load them.
    const std::vector<int64_t>& moe = ex_->moe_layers();
    loaded_bytes_ = 0;
    for (size_t i = 0; i < moe.size(); ++i)
      for (int s = 0; s < slots_; ++s) {
        XDS_RETURN_IF_ERROR(ex_->set_redundant_slot(moe[i], primary_ + s, -1, nullptr));
        if (want_[i][size_t(s)] < 0) continue;
        int held = -1;
        XDS_ASSIGN_OR_RETURN(const MlpWeights* w, store_->commit(int64_t(i), s, &held));
        XDS_RETURN_IF_ERROR(ex_->set_redundant_slot(moe[i], primary_ + s, held, w));
        loaded_bytes_ += store_->slot_bytes(int64_t(i));
      }
    loaded_ = version_;
    phase_ = Phase::kLoaded;
    XDS_LOG_INFO("DP group {}: EPLB step {}: redundant slots disabled (map v{}), {:.1f} MiB loaded",
                 group, step, version_ - 1, double(loaded_bytes_) / (1 << 20));
  }
  if (phase_ == Phase::kLoaded && agreed >= version_ && ex_->map_version() == version_ - 1) {
    // Phase 4: every device switches to the new map at this step.
    XDS_RETURN_IF_ERROR(ex_->set_expert_maps(final_));
    XDS_LOG_INFO("DP group {}: EPLB step {}: map v{} in force", group, step, version_);
    EplbReport r;
    r.group = group;
    r.version = version_;
    r.state = EplbState::kSwitched;
    r.disable_step = disable_step_;
    r.switch_step = step;
    r.loaded_bytes = loaded_bytes_;
    drop_pending();
    close_window_ = true;  // the next window starts under the new map
    return std::optional<EplbReport>(r);
  }
  return std::optional<EplbReport>();
}

void EplbAgent::fill_window(int64_t now_ns, bool force, GroupLoad& l) {
  const std::span<const int64_t> experts = model_->routed_token_counts();
  const std::span<const int64_t> slots = ex_->slot_rows();
  if (window_start_ns_ < 0) {  // the first call opens the first window
    window_start_ns_ = now_ns;
    window_open_version_ = ex_->map_version();
    last_experts_.assign(experts.begin(), experts.end());
    last_slots_.assign(slots.begin(), slots.end());
    return;
  }
  if (!force && !close_window_ && now_ns - window_start_ns_ < window_ns_) return;
  close_window_ = false;
  l.window_seq = ++window_seq_;
  l.window_expert_tokens.resize(experts.size());
  for (size_t i = 0; i < experts.size(); ++i)
    l.window_expert_tokens[i] = experts[i] - (i < last_experts_.size() ? last_experts_[i] : 0);
  l.window_slot_tokens.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i)
    l.window_slot_tokens[i] = slots[i] - (i < last_slots_.size() ? last_slots_[i] : 0);
  l.moe_layers = model_->info().moe_layers;
  l.n_experts = model_->info().n_routed_experts;
  l.slots_per_device = ex_->slots_per_device();
  l.window_map_version = ex_->map_version();
  l.window_uniform = window_open_version_ == ex_->map_version();
  if (l.expert_tokens.empty()) l.expert_tokens.assign(experts.begin(), experts.end());
  last_experts_.assign(experts.begin(), experts.end());
  last_slots_.assign(slots.begin(), slots.end());
  window_start_ns_ = now_ns;
  window_open_version_ = ex_->map_version();
}

}  // namespace xds::engine

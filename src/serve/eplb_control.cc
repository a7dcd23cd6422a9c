#include "serve/eplb_control.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/log.h"
#include "engine/eplb_maps.h"
#include "eplb/planner.h"

namespace xds::serve {

using protocol::EplbCommand;
using protocol::EplbOp;
using protocol::EplbReport;
using protocol::EplbState;

EplbControl::EplbControl(EplbControlOptions o) : o_(o) {
  o_.slices = std::max(1, o_.slices);
}

void EplbControl::on_window(const protocol::GroupLoad& l) {
  if (stopped_ || l.group < 0 || l.group >= o_.n_groups || l.n_experts <= 0) return;
  const size_t rows = l.moe_layers.size();
  if (!shape_known() && rows > 0 && l.n_experts % o_.n_groups == 0) {
    // From the first expert counts (about a second after the start), windows or not.
    moe_layers_ = l.moe_layers;
    n_experts_ = l.n_experts;
    spd_ = n_experts_ / o_.n_groups + o_.redundant_slots;
    expert_total_.assign(rows * size_t(n_experts_), 0.0);
    slot_total_.assign(rows * size_t(o_.n_groups * spd_), 0.0);
  }
  if (l.window_seq <= 0) return;
  if (l.moe_layers != moe_layers_ || l.n_experts != n_experts_ || l.slots_per_device != spd_ ||
      l.window_expert_tokens.size() != rows * size_t(n_experts_) ||
      l.window_slot_tokens.size() != rows * size_t(spd_)) {
    XDS_LOG_WARN("shell: EPLB window {} of group {} has another shape; ignored", l.window_seq,
                 l.group);
    return;
  }
  Slice& s = open_[l.window_seq];
  if (s.reported == 0) {
    s.experts.assign(rows * size_t(n_experts_), 0.0);
    s.slots.assign(rows * size_t(o_.n_groups * spd_), 0.0);
    s.version = l.window_map_version;
  }
  for (size_t i = 0; i < s.experts.size(); ++i) s.experts[i] += double(l.window_expert_tokens[i]);
  const size_t width = size_t(o_.n_groups * spd_);
  for (size_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < spd_; ++k)
      s.slots[r * width + size_t(l.group * spd_ + k)] +=
          double(l.window_slot_tokens[r * size_t(spd_) + size_t(k)]);
  s.uniform = s.uniform && l.window_uniform && s.version == l.window_map_version;
  s.version = std::min(s.version, l.window_map_version);
  if (++s.reported < o_.n_groups) return;
  // Complete: keep it, and every older slice still open is dropped (a group skipped it).
  for (size_t i = 0; i < s.experts.size(); ++i) expert_total_[i] += s.experts[i];
  for (size_t i = 0; i < s.slots.size(); ++i) slot_total_[i] += s.slots[i];
  done_.push_back(std::move(s));
  while (int(done_.size()) > o_.slices) done_.pop_front();
  open_.erase(open_.begin(), open_.upper_bound(l.window_seq));
}

std::vector<double> EplbControl::layer_ratio_measured(bool after) const {
  // Device loads over the complete slices taken under the map in force (after) or under the
  // map of the rebalance's start (before: the caller picks which slices).
  const size_t rows = moe_layers_.size(), width = size_t(o_.n_groups * spd_);
  std::vector<double> sum(rows * width, 0.0);
  bool any = false;
  for (const Slice& s : done_) {
    if (!s.uniform || (after && s.version != version_)) continue;
    any = true;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += s.slots[i];
  }
  std::vector<double> out;
  if (!any) return out;
  for (size_t r = 0; r < rows; ++r) {
    const engine::DeviceLoad d = engine::device_load(
        o_.n_groups, int(spd_), std::span<const double>(sum.data() + r * width, width));
    out.push_back(d.ratio());
  }
  return out;
}

std::vector<double> EplbControl::layer_ratio_predicted_now() const {
  const size_t rows = moe_layers_.size(), e_n = size_t(n_experts_);
  std::vector<double> sum(rows * e_n, 0.0);
  bool any = false;
  for (const Slice& s : done_) {
    if (!s.uniform || s.version != version_) continue;
    any = true;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += s.experts[i];
  }
  std::vector<double> out;
  if (!any) return out;
  const eplb::Shape shape = this->shape();
  const auto identity = engine::primary_replicas(shape);
  for (size_t r = 0; r < rows; ++r) {
    const auto& reps = replicas_.empty() ? identity : replicas_[r];
    std::vector<double> load(size_t(o_.n_groups), 0.0);
    for (size_t e = 0; e < e_n && e < reps.size(); ++e)
      for (int32_t p : reps[e]) load[size_t(p / spd_)] += sum[r * e_n + e] / double(reps[e].size());
    double mx = 0, mean = 0;
    for (double v : load) {
      mx = std::max(mx, v);
      mean += v;
    }
    mean /= o_.n_groups;
    out.push_back(mean > 0 ? mx / mean : 1.0);
  }
  return out;
}

std::optional<EplbAnswer> EplbControl::refuse_start() const {
  if (!enabled())
    return EplbAnswer{400,
                      {{"error", fmt::format("EPLB is off: it needs --dp > 1 and --redundant-slots "
                                             "> 0 (this instance: --dp {}, --redundant-slots {})",
                                             o_.n_groups, o_.redundant_slots)}}};
  if (stopped_) return EplbAnswer{409, {{"error", "EPLB stopped: " + stopped_why_}}};
  if (phase_ != Phase::kIdle)
    return EplbAnswer{
        409,
        {{"error", fmt::format("a reconfiguration to map v{} is in progress", pending_version_)}}};
  return std::nullopt;
}

EplbAnswer EplbControl::backup(int64_t now_ns, std::optional<EplbCommand>& command) {
  command.reset();
  if (auto refused = refuse_start()) return *refused;
  if (!shape_known()) return {409, {{"error", "the model's shape is not known yet"}}};
  const eplb::Shape shape = this->shape();
  last_start_ns_ = now_ns;
  const size_t rows = moe_layers_.size();
  pending_replicas_.assign(rows, engine::backup_replicas(shape));
  pending_predicted_.assign(rows, 1.0);
  pending_before_.assign(rows, 1.0);
  XDS_LOG_INFO("shell: EPLB map v{}: every group's experts copied on the next group (backup)",
               version_ + 2);
  return start(command);
}

Status EplbControl::covers(const std::vector<int>& after) const {
  if (!shape_known()) return failed_precondition("the model's expert shape is not known yet");
  const eplb::Shape shape = this->shape();
  std::vector<int> before;
  for (int g = 0; g < o_.n_groups; ++g) before.push_back(g);
  for (size_t r = 0; r < moe_layers_.size(); ++r) {
    xccl::ExpertMap m;
    m.n_devices = o_.n_groups;
    m.slots_per_device = int(spd_);
    m.replicas = replicas_.empty() ? engine::primary_replicas(shape) : replicas_[r];
    auto left = engine::scaled_down_map(m, before, after);
    if (!left.ok()) return left.status().with_context(fmt::format("MoE layer {}", moe_layers_[r]));
  }
  return {};
}

void EplbControl::stop(std::string why) {
  stopped_ = true;
  stopped_why_ = std::move(why);
}

void EplbControl::rejoined(uint64_t version) {
  stopped_ = false;
  stopped_why_.clear();
  version_ = version;
  replicas_.clear();
  phase_ = Phase::kIdle;
}

EplbAnswer EplbControl::rebalance(int64_t now_ns, std::optional<EplbCommand>& command) {
  command.reset();
  if (auto refused = refuse_start()) return *refused;
  if (done_.empty()) return {409, {{"error", "no collect window has closed yet (--eplb-window)"}}};
  last_start_ns_ = now_ns;
  eplb::PlanParams params;
  params.shape = shape();
  std::vector<eplb::LayerCounts> layers;
  const size_t rows = moe_layers_.size();
  for (size_t r = 0; r < rows; ++r) {
    eplb::LayerCounts c;
    c.layer = int(moe_layers_[r]);
    c.n_slices = int(done_.size());
    for (const Slice& s : done_)
      c.counts.insert(c.counts.end(), s.experts.begin() + long(r * size_t(n_experts_)),
                      s.experts.begin() + long((r + 1) * size_t(n_experts_)));
    layers.push_back(std::move(c));
  }
  auto plan = eplb::plan_layers(params, layers);
  if (!plan.ok()) return {500, {{"error", plan.status().to_string()}}};
  pending_replicas_.assign(rows, {});
  pending_predicted_.assign(rows, 1.0);
  pending_before_.assign(rows, 1.0);
  for (size_t r = 0; r < rows; ++r) {
    const eplb::LayerPlan& lp = plan->layers[r];
    auto slots = eplb::plan_slots(params.shape, lp);
    if (!slots.ok()) return {500, {{"error", slots.status().to_string()}}};
    auto reps = engine::replicas_of_slots(params.shape, *slots);
    if (!reps.ok()) return {500, {{"error", reps.status().to_string()}}};
    pending_replicas_[r] = std::move(*reps);
    auto pred = eplb::predict_load(params.shape, layers[r], lp);
    if (pred.ok() && pred->mean > 0) pending_predicted_[r] = pred->max / pred->mean;
    auto base = eplb::predict_load(params.shape, layers[r], eplb::LayerPlan{});
    if (base.ok() && base->mean > 0) pending_before_[r] = base->max / base->mean;
  }
  if (const std::vector<double> measured = layer_ratio_measured(/*after=*/true); !measured.empty())
    pending_before_ = measured;  // the map in force, measured
  XDS_LOG_INFO("shell: EPLB plans map v{} from {} windows", version_ + 2, done_.size());
  return start(command);
}

EplbAnswer EplbControl::start(std::optional<EplbCommand>& command) {
  pending_version_ = version_ + 2;
  phase_ = Phase::kPreparing;
  prepared_.assign(size_t(o_.n_groups), 0);
  switched_.assign(size_t(o_.n_groups), 0);
  disable_steps_.assign(size_t(o_.n_groups), -1);
  switch_steps_.assign(size_t(o_.n_groups), -1);
  loaded_bytes_.assign(size_t(o_.n_groups), 0);
  EplbCommand c;
  c.op = EplbOp::kPrepare;
  c.version = pending_version_;
  c.moe_layers = moe_layers_;
  c.replicas = pending_replicas_;
  command = std::move(c);
  nlohmann::json body = {{"version", pending_version_},
                         {"phase", "preparing"},
                         {"slices", done_.size()},
                         {"predicted_max_mean", pending_predicted_},
                         {"before_max_mean", pending_before_}};
  return {202, body};
}

bool EplbControl::due(int64_t now_ns) const {
  return enabled() && !stopped_ && o_.interval_s > 0 && phase_ == Phase::kIdle && !done_.empty() &&
         double(now_ns - last_start_ns_) >= o_.interval_s * 1e9;
}

std::optional<EplbCommand> EplbControl::on_report(const EplbReport& r) {
  if (phase_ == Phase::kIdle || r.version != pending_version_ || r.group < 0 ||
      r.group >= o_.n_groups)
    return std::nullopt;
  const size_t g = size_t(r.group);
  EplbCommand c;
  c.version = pending_version_;
  switch (r.state) {
    case EplbState::kPrepared:
      if (phase_ != Phase::kPreparing) return std::nullopt;
      prepared_[g] = 1;
      if (std::count(prepared_.begin(), prepared_.end(), 1) < o_.n_groups) return std::nullopt;
      phase_ = Phase::kCommitted;
      c.op = EplbOp::kCommit;
      return c;
    case EplbState::kFailed:
      if (phase_ != Phase::kPreparing) return std::nullopt;
      ++failed_count_;
      last_error_ = fmt::format("device {}: {}", r.group, r.error);
      XDS_LOG_WARN("shell: EPLB map v{} aborted: {}", pending_version_, last_error_);
      phase_ = Phase::kIdle;
      c.op = EplbOp::kAbort;
      return c;
    case EplbState::kSwitched:
      switched_[g] = 1;
      disable_steps_[g] = int64_t(r.disable_step);
      switch_steps_[g] = int64_t(r.switch_step);
      loaded_bytes_[g] = r.loaded_bytes;
      if (std::count(switched_.begin(), switched_.end(), 1) < o_.n_groups) return std::nullopt;
      version_ = pending_version_;
      replicas_ = pending_replicas_;
      before_ = pending_before_;
      predicted_ = pending_predicted_;
      ++done_count_;
      phase_ = Phase::kIdle;
      XDS_LOG_INFO("shell: EPLB map v{} in force on every device", version_);
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

nlohmann::json EplbControl::state() const {
  nlohmann::json j;
  j["enabled"] = enabled();
  j["map_version"] = version_;
  j["n_devices"] = o_.n_groups;
  j["redundant_slots"] = o_.redundant_slots;
  j["n_experts"] = n_experts_;
  j["slots_per_device"] = spd_;
  j["phase"] = phase_ == Phase::kIdle        ? "idle"
               : phase_ == Phase::kPreparing ? "preparing"
                                             : "committed";
  if (phase_ != Phase::kIdle) j["pending_version"] = pending_version_;
  if (stopped_) j["stopped"] = stopped_why_;
  j["rebalances_done"] = done_count_;
  j["rebalances_failed"] = failed_count_;
  if (!last_error_.empty()) j["last_error"] = last_error_;
  j["slices"] = done_.size();
  const std::vector<double> after = layer_ratio_measured(/*after=*/true);
  const std::vector<double> after_predicted = layer_ratio_predicted_now();
  const size_t width = size_t(o_.n_groups * spd_);
  const eplb::Shape shape = this->shape();
  nlohmann::json layers = nlohmann::json::array();
  for (size_t r = 0; r < moe_layers_.size(); ++r) {
    nlohmann::json l;
    l["layer"] = moe_layers_[r];
    l["replicas"] = replicas_.empty() && n_experts_ > 0 && shape.n_devices > 0
                        ? engine::primary_replicas(shape)
                        : replicas_[r];
    std::vector<double> experts(expert_total_.begin() + long(r * size_t(n_experts_)),
                                expert_total_.begin() + long((r + 1) * size_t(n_experts_)));
    l["expert_tokens"] = experts;
    const engine::DeviceLoad d = engine::device_load(
        o_.n_groups, int(spd_), std::span<const double>(slot_total_.data() + r * width, width));
    l["device_tokens"] = d.load;
    nlohmann::json ratio = nlohmann::json::object();
    if (r < before_.size()) ratio["before"] = before_[r];
    if (r < predicted_.size()) ratio["predicted"] = predicted_[r];
    if (r < after.size()) ratio["current"] = after[r];
    if (r < after_predicted.size()) ratio["current_predicted"] = after_predicted[r];
    l["max_mean"] = ratio;
    layers.push_back(std::move(l));
  }
  j["layers"] = std::move(layers);
  if (!switch_steps_.empty()) {
    j["last_rebalance"] = {{"version", pending_version_},
                           {"disable_step", disable_steps_},
                           {"switch_step", switch_steps_},
                           {"loaded_bytes", loaded_bytes_}};
  }
  return j;
}

std::string EplbControl::metrics_text() const {
  std::string out;
  out += "# HELP xdeepserve_eplb_map_version Expert map version in force on every device.\n";
  out += "# TYPE xdeepserve_eplb_map_version gauge\n";
  out += fmt::format("xdeepserve_eplb_map_version {}\n", version_);
  out += "# HELP xdeepserve_eplb_rebalances_total EPLB reconfigurations by result.\n";
  out += "# TYPE xdeepserve_eplb_rebalances_total counter\n";
  out += fmt::format("xdeepserve_eplb_rebalances_total{{result=\"done\"}} {}\n", done_count_);
  out += fmt::format("xdeepserve_eplb_rebalances_total{{result=\"failed\"}} {}\n", failed_count_);
  if (!switch_steps_.empty()) {
    out +=
        "# HELP xdeepserve_eplb_switch_step Step at which each device put the last map in "
        "force.\n# TYPE xdeepserve_eplb_switch_step gauge\n";
    for (size_t g = 0; g < switch_steps_.size(); ++g)
      out += fmt::format("xdeepserve_eplb_switch_step{{device=\"{}\"}} {}\n", g, switch_steps_[g]);
  }
  if (!shape_known()) return out;
  const size_t width = size_t(o_.n_groups * spd_);
  out +=
      "# HELP xdeepserve_eplb_device_tokens_total Token-expert pairs computed by each device's "
      "expert slots (collect windows).\n# TYPE xdeepserve_eplb_device_tokens_total counter\n";
  for (size_t r = 0; r < moe_layers_.size(); ++r) {
    const engine::DeviceLoad d = engine::device_load(
        o_.n_groups, int(spd_), std::span<const double>(slot_total_.data() + r * width, width));
    for (int g = 0; g < o_.n_groups; ++g)
      out += fmt::format("xdeepserve_eplb_device_tokens_total{{layer=\"{}\",device=\"{}\"}} {}\n",
                         moe_layers_[r], g, d.load[size_t(g)]);
  }
  out +=
      "# HELP xdeepserve_eplb_slot_tokens_total Token-expert pairs computed by each expert slot "
      "(collect windows).\n# TYPE xdeepserve_eplb_slot_tokens_total counter\n";
  for (size_t r = 0; r < moe_layers_.size(); ++r)
    for (int g = 0; g < o_.n_groups; ++g)
      for (int64_t k = 0; k < spd_; ++k)
        out += fmt::format(
            "xdeepserve_eplb_slot_tokens_total{{layer=\"{}\",device=\"{}\",slot=\"{}\"}} {}\n",
            moe_layers_[r], g, k, slot_total_[r * width + size_t(g * spd_ + k)]);
  const std::vector<double> after = layer_ratio_measured(/*after=*/true);
  out +=
      "# HELP xdeepserve_eplb_device_load_max_mean Max over mean device load per MoE layer: "
      "before the last rebalance, predicted by the planner, and measured under the map in "
      "force.\n# TYPE xdeepserve_eplb_device_load_max_mean gauge\n";
  for (size_t r = 0; r < moe_layers_.size(); ++r) {
    if (r < before_.size())
      out +=
          fmt::format("xdeepserve_eplb_device_load_max_mean{{layer=\"{}\",when=\"before\"}} {}\n",
                      moe_layers_[r], before_[r]);
    if (r < predicted_.size())
      out += fmt::format(
          "xdeepserve_eplb_device_load_max_mean{{layer=\"{}\",when=\"predicted\"}} {}\n",
          moe_layers_[r], predicted_[r]);
    if (r < after.size())
      out +=
          fmt::format("xdeepserve_eplb_device_load_max_mean{{layer=\"{}\",when=\"current\"}} {}\n",
                      moe_layers_[r], after[r]);
  }
  return out;
}

}  // namespace xds::serve

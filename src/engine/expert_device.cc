#include "engine/expert_device.h"

#include <pthread.h>
#include <sched.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/log.h"
#include "base/process_name.h"
#include "kernels/cpu/linear.h"
#include "model/grouped_experts.h"
#include "model/registry.h"
#include "xccl/expert_map.h"
#include "xccl/fabric.h"
#include "xccl/mailbox.h"
#include "xccl/transport.h"

namespace xds::engine {
namespace {

class ExpertLoop {
 public:
  ExpertLoop(xccl::Fabric& f, const ExpertDeviceOptions& o) : f_(f), o_(o) {}
  Status init();
  Status run();
  const ExpertLoopStats& stats() const { return stats_; }
  int expert_index() const { return f_.rank() - o_.ae.shape.attention; }

 private:
  Status serve_round(int64_t layer, uint64_t key, int domain);

  xccl::Fabric& f_;
  ExpertDeviceOptions o_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<xccl::Transport> transport_;
  std::unique_ptr<xccl::Mailbox> mailbox_;
  std::unique_ptr<xccl::A2e> a2e_;
  std::unique_ptr<GroupedExperts> experts_;
  xccl::MoeConfig cfg_;
  xccl::ExpertMap map_;                                // the same for every MoE layer
  std::vector<int64_t> moe_layers_;                    // main-model MoE layers, ascending
  std::vector<std::vector<const MlpWeights*>> slots_;  // [layers][slots]
  std::vector<float> out_;                             // [rows, D] f32 (bf16 vectors)
  ExpertLoopStats stats_;
  int64_t start_ns_ = 0;
};

Status ExpertLoop::init() {
  XDS_RETURN_IF_ERROR(validate_ae_shape(o_.ae.shape));
  if (!ae_is_expert_rank(o_.ae.shape, f_.rank()))
    return invalid_argument("expert device: rank {} is not an expert rank of the instance",
                            f_.rank());
  XDS_ASSIGN_OR_RETURN(model_, load_causal_lm(o_.model_dir, o_.model));
  const ModelInfo& info = model_->info();
  cfg_ = ae_moe_config(info, model_->compute_dtype(), o_.ae);
  XDS_ASSIGN_OR_RETURN(transport_, xccl::make_transport("shm", f_));
  mailbox_ = std::make_unique<xccl::Mailbox>(f_, *transport_);
  XDS_ASSIGN_OR_RETURN(a2e_, xccl::A2e::create(*mailbox_, cfg_, ae_a2e_topology(o_.ae),
                                               &model_->pool()));
  experts_ = std::make_unique<GroupedExperts>(model_->compute_dtype(), model_->pool());
  const int x = o_.ae.shape.experts, slots = cfg_.slots_per_device, me = expert_index();
  map_ = ae_expert_map(info, o_.ae);
  (void)x;
  std::vector<int32_t> logical(size_t(slots), -1);
  for (int e = 0; e < map_.n_logical(); ++e)
    for (int32_t p : map_.replicas[size_t(e)])
      if (p / slots == me) logical[size_t(p % slots)] = e;
  // The main model's MoE layers: the turns of a step (MTP passes are not served yet).
  for (int64_t l : info.moe_layers)
    if (l < info.num_layers) moe_layers_.push_back(l);
  slots_.resize(size_t(info.num_layers + info.n_mtp_layers));
  int held = 0;
  for (int32_t e : logical) held += e >= 0;
  for (int64_t l : info.moe_layers) {
    const MoeWeights* w = model_->moe_weights(l);
    if (w == nullptr) return invalid_argument("expert device: MoE layer {} has no experts", l);
    XDS_RETURN_IF_ERROR(bind_expert_slots(*w, logical, slots_[size_t(l)])
                            .with_context(fmt::format("layer {}", l)));
  }
  XDS_LOG_INFO("expert device {} (rank {}): {} of {} routed experts in {} slots, {} MoE layers",
               me, f_.rank(), held, info.n_routed_experts, slots, moe_layers_.size());
  return Status::ok_status();
}

Status ExpertLoop::serve_round(int64_t layer, uint64_t key, int domain) {
  XDS_RETURN_IF_ERROR(a2e_->a2e_recv(domain, map_, key));
  const xccl::Exchange& ex = a2e_->exchange();
  const xccl::RecvLayout& l = ex.received();
  const int64_t rows = l.n_rows(), d = cfg_.hidden;
  const bool f32 = cfg_.vector_dtype == xccl::RowDType::kF32;
  float* out = nullptr;
  if (f32) {
    out = a2e_->expert_out_f32();
  } else {
    if (out_.size() < size_t(rows * d)) out_.resize(size_t(rows * d));
    out = out_.data();
  }
  const int64_t t0 = now_ns();
  GroupedExpertsInput g;
  g.slots = slots_[size_t(layer)];
  g.offsets = l.expert_offset;
  g.rows = ex.unit_rows();
  g.row_dtype = f32 ? DType::kF32 : DType::kBF16;
  g.row_stride = d;
  g.gather = ex.row_units().data();
  g.out = out;
  XDS_RETURN_IF_ERROR(experts_->run(g).with_context(fmt::format("layer {}", layer)));
  if (!f32 && rows > 0) kernels::round_to_bf16(out, rows * d, a2e_->expert_out());
  stats_.busy_ns += now_ns() - t0;
  stats_.rows += rows;
  return a2e_->e2a_send(key);
}

Status ExpertLoop::run() {
  const AeShape& s = o_.ae.shape;
  const std::vector<AeTurn> turns =
      ae_expert_turns(int(moe_layers_.size()), s.domains, s.microbatches);
  const int leader = 0;  // attention rank 0 posts the step notices
  // No deadline: an idle instance sleeps here (a dead leader still poisons the epoch).
  const xccl::WaitCtx idle{xccl::OpKind::kBarrier, xccl::kNoDeadline, {}};
  for (uint64_t step = 0;; ++step) {
    xccl::MailWords w{};
    XDS_RETURN_IF_ERROR(mailbox_->wait_all(std::span<const int>(&leader, 1),
                                           xccl::Channel::kAeStep,
                                           ae_notice_key(f_.epoch(), step), idle,
                                           std::span<xccl::MailWords>(&w, 1)));
    if (start_ns_ == 0) start_ns_ = now_ns();
    if (w[0] == AeStepNotice::kStop) return Status::ok_status();
    if (w[0] == AeStepNotice::kAbort)
      return aborted("expert device {}: the attention groups aborted step {}", expert_index(),
                     step);
    if (w[0] != AeStepNotice::kRun || w[1] != step)
      return data_loss("expert device {}: step notice kind {} step {}, expected a run of step {}",
                       expert_index(), w[0], w[1], step);
    for (const AeTurn& t : turns) {
      const int64_t layer = moe_layers_[size_t(t.moe_index)];
      AeTraceEntry e{step, t.domain, layer, t.microbatch, stats_.rows, now_ns() - start_ns_, 0};
      for (int r = 0;; ++r) {
        if (r >= kMaxAeRounds)
          return internal_error("expert device {}: layer {} still has rows after {} rounds",
                                expert_index(), layer, kMaxAeRounds);
        const uint64_t key = xccl::a2e_key(f_.epoch(), uint32_t(step), uint16_t(layer), t.domain,
                                           ae_round_code(t.microbatch, r));
        XDS_RETURN_IF_ERROR(serve_round(layer, key, t.domain));
        if (!a2e_->any_more()) break;
      }
      e.rows = stats_.rows - e.rows;
      e.end_ns = now_ns() - start_ns_;
      if (stats_.trace.size() >= ExpertLoopStats::kMaxTrace)
        stats_.trace.erase(stats_.trace.begin(), stats_.trace.begin() + 1024);
      stats_.trace.push_back(e);
      ++stats_.turns;
      stats_.wall_ns = e.end_ns;
    }
    ++stats_.steps;
  }
}

void pin_threads(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

std::string expert_stats_json(const ExpertLoopStats& s, int expert_index) {
  nlohmann::json j;
  j["expert_device"] = expert_index;
  j["steps"] = s.steps;
  j["turns"] = s.turns;
  j["rows"] = s.rows;
  j["busy_ns"] = s.busy_ns;
  j["wall_ns"] = s.wall_ns;
  j["busy_fraction"] = s.wall_ns > 0 ? double(s.busy_ns) / double(s.wall_ns) : 0.0;
  j["controller_round_trips"] = s.controller_round_trips;
  j["controller_round_trips_per_step"] =
      s.steps > 0 ? double(s.controller_round_trips) / double(s.steps) : 0.0;
  nlohmann::json t = nlohmann::json::array();
  for (const AeTraceEntry& e : s.trace)
    t.push_back({{"step", e.step}, {"domain", e.domain}, {"layer", e.layer},
                 {"microbatch", e.microbatch}, {"rows", e.rows}, {"begin_ns", e.begin_ns},
                 {"end_ns", e.end_ns}});
  j["trace"] = std::move(t);
  return j.dump();
}

int run_expert_device(xccl::Fabric& fabric, const ExpertDeviceOptions& options) {
  const int index = fabric.rank() - options.ae.shape.attention;
  set_process_name(process_name("exp", options.instance, index));
  pin_threads(options.cpu);
  ExpertLoop loop(fabric, options);
  Status st = loop.init();
  if (st.ok()) st = loop.run();
  if (!options.ae.trace_dir.empty()) {
    const std::string path = fmt::format("{}/expert{}.json", options.ae.trace_dir, index);
    std::ofstream out(path);
    out << expert_stats_json(loop.stats(), index) << "\n";
    if (!out) XDS_LOG_WARN("expert device {}: cannot write {}", index, path);
  }
  if (!st.ok()) {
    XDS_LOG_ERROR("expert device {}: {}", index, st.to_string());
    return 1;
  }
  return 0;
}

}  // namespace xds::engine

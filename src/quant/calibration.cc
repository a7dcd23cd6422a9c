#include "quant/calibration.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "model/kv_cache.h"

namespace xds {

LinearStats::LinearStats(int64_t c)
    : cols(c), hessian(static_cast<size_t>(c * c), 0.0), act_max(static_cast<size_t>(c), 0.0f) {}

void LinearStats::add(const float* x, int64_t n, int64_t ldx) {
  if (n <= 0) return;
  std::vector<double> xd(static_cast<size_t>(n * cols));  // [n, cols]
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < cols; ++j) {
      const float v = x[t * ldx + j];
      xd[t * cols + j] = v;
      act_max[j] = std::max(act_max[j], std::fabs(v));
    }
  }
  // H (upper) += Xᵀ X
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(cols), static_cast<int>(n),
              1.0, xd.data(), static_cast<int>(cols), 1.0, hessian.data(), static_cast<int>(cols));
  tokens += n;
}

void LinearStats::finish() {
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < i; ++j) hessian[i * cols + j] = hessian[j * cols + i];
}

Result<std::unique_ptr<Calibrator>> Calibrator::attach(DeepseekV3Model& model) {
  std::unique_ptr<Calibrator> c(new Calibrator(model));
  const DeepseekV3Weights& w = model.weights();
  const int64_t n_main = static_cast<int64_t>(w.layers.size());
  for (int64_t l = 0; l < n_main; ++l) c->add_names(w.layers[l], l);
  for (size_t k = 0; k < w.mtp.size(); ++k) c->add_names(w.mtp[k].layer, n_main + static_cast<int64_t>(k));
  for (const auto& [layer, experts] : c->expert_tokens_) {
    const LayerWeights& lw = layer < n_main ? w.layers[layer] : w.mtp[layer - n_main].layer;
    if (!lw.moe->shared) {
      return unimplemented("calibration: MoE layer {} has no shared expert (n_shared_experts 0): "
                           "its routed experts' inputs would not be seen", layer);
    }
  }
  Calibrator* self = c.get();
  model.set_linear_observer([self](const MatrixRef& m, const float* x, int64_t n, int64_t ldx) {
    self->on_linear(m, x, n, ldx);
  });
  model.set_routing_observer([self](int64_t layer, int64_t t, std::span<const int32_t> ids) {
    self->on_route(layer, t, ids);
  });
  return c;
}

Calibrator::~Calibrator() {
  model_.set_linear_observer({});
  model_.set_routing_observer({});
}

void Calibrator::add_names(const LayerWeights& w, int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer);
  auto add = [&](const MatrixRef& m, const std::string& name) {
    names_[m.data] = name;
    stats_.emplace(name, LinearStats(m.cols));
  };
  const std::string a = p + ".self_attn.";
  if (w.attn.q_a_proj) add(*w.attn.q_a_proj, a + "q_a_proj.weight");
  if (w.attn.q_b_proj) add(*w.attn.q_b_proj, a + "q_b_proj.weight");
  if (w.attn.q_proj) add(*w.attn.q_proj, a + "q_proj.weight");
  add(w.attn.kv_a_proj, a + "kv_a_proj_with_mqa.weight");
  add(w.attn.o_proj, a + "o_proj.weight");
  auto add_mlp = [&](const MlpWeights& m, const std::string& q) {
    add(m.gate_proj, q + ".gate_proj.weight");
    add(m.up_proj, q + ".up_proj.weight");
    add(m.down_proj, q + ".down_proj.weight");
  };
  if (w.dense) add_mlp(*w.dense, p + ".mlp");
  if (w.moe) {
    if (w.moe->shared) {
      add_mlp(*w.moe->shared, p + ".mlp.shared_experts");
      shared_gate_layer_[w.moe->shared->gate_proj.data] = layer;
    }
    for (size_t e = 0; e < w.moe->experts.size(); ++e)
      add_mlp(w.moe->experts[e], p + ".mlp.experts." + std::to_string(e));
    expert_tokens_[layer].assign(w.moe->experts.size(), 0);
  }
}

void Calibrator::on_linear(const MatrixRef& w, const float* x, int64_t n, int64_t ldx) {
  const auto it = names_.find(w.data);
  if (it == names_.end()) return;  // not a quantized linear (lm_head, kv_b_proj, eh_proj)
  stats_.at(it->second).add(x, n, ldx);
  if (const auto s = shared_gate_layer_.find(w.data); s != shared_gate_layer_.end()) {
    std::vector<float>& rows = step_rows_[s->second];
    rows.resize(static_cast<size_t>(n * w.cols));
    for (int64_t t = 0; t < n; ++t)
      std::copy(x + t * ldx, x + t * ldx + w.cols, rows.data() + t * w.cols);
  }
}

void Calibrator::on_route(int64_t layer, int64_t token, std::span<const int32_t> ids) {
  auto& routes = step_routes_[layer];
  if (static_cast<int64_t>(routes.size()) <= token) routes.resize(static_cast<size_t>(token + 1));
  routes[token].assign(ids.begin(), ids.end());
}

void Calibrator::add_expert_inputs() {
  const DeepseekV3Weights& w = model_.weights();
  const int64_t n_main = static_cast<int64_t>(w.layers.size());
  const std::string_view kParts[] = {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"};
  for (auto& [layer, routes] : step_routes_) {
    const LayerWeights& lw = layer < n_main ? w.layers[layer] : w.mtp[layer - n_main].layer;
    const std::vector<float>& rows = step_rows_[layer];
    const int64_t d = lw.moe->router.cols;
    XDS_CHECK(static_cast<int64_t>(rows.size()) == static_cast<int64_t>(routes.size()) * d,
              "MoE layer {}: {} input values for {} routed tokens", layer, rows.size(),
              routes.size());
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    for (size_t e = 0; e < lw.moe->experts.size(); ++e) {
      std::vector<float> xe;  // [m, D] the rows routed to e
      for (size_t t = 0; t < routes.size(); ++t) {
        if (std::find(routes[t].begin(), routes[t].end(), static_cast<int32_t>(e)) ==
            routes[t].end())
          continue;
        xe.insert(xe.end(), rows.begin() + t * d, rows.begin() + (t + 1) * d);
      }
      const int64_t m = static_cast<int64_t>(xe.size()) / d;
      if (m == 0) continue;
      expert_tokens_[layer][e] += m;
      const MlpWeights& mlp = lw.moe->experts[e];
      const int64_t width = mlp.gate_proj.rows;
      std::vector<float> g(static_cast<size_t>(m * width)), u(g.size());  // [m, I]
      kernels::linear_f32(xe.data(), m, d, mlp.gate_proj, g.data(), width, model_.pool());
      kernels::linear_f32(xe.data(), m, d, mlp.up_proj, u.data(), width, model_.pool());
      kernels::silu_mul(g.data(), u.data(), m * width, g.data());
      const std::string name = p + std::to_string(e);
      stats_.at(name + std::string(kParts[0])).add(xe.data(), m, d);
      stats_.at(name + std::string(kParts[1])).add(xe.data(), m, d);
      stats_.at(name + std::string(kParts[2])).add(g.data(), m, width);
    }
  }
  step_rows_.clear();
  step_routes_.clear();
}

Status Calibrator::run_window(std::span<const int32_t> ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n < 2) return invalid_argument("calibration: a window of {} tokens (at least 2)", n);
  XDS_ASSIGN_OR_RETURN(KvCache cache, model_.make_cache(n + 16));
  const int64_t seq = cache.add_sequence();
  XDS_ASSIGN_OR_RETURN(const TokenChunk ch, cache.chunk(seq, 0, ids, true));
  StepOutput main;
  XDS_RETURN_IF_ERROR(model_.forward({&ch, 1}, cache.storage(), main));
  add_expert_inputs();
  const int64_t mtp = model_.config().num_nextn_predict_layers;
  for (int64_t k = 0; k < mtp; ++k) {
    XDS_ASSIGN_OR_RETURN(const MtpChunk rows,
                         cache.mtp_chunk(seq, 0, ids.subspan(1), main.hidden.data()));
    StepOutput out;
    XDS_RETURN_IF_ERROR(model_.forward_mtp(k, {&rows, 1}, cache.storage(), out));
    add_expert_inputs();
  }
  return {};
}

void Calibrator::finish() {
  for (auto& [name, s] : stats_) s.finish();
}

}  // namespace xds

// Calibration: the input statistics of every linear the W8A8 layout quantizes
// (quant/w8a8_rtn.h), taken from the float model's own forward over a calibration text.
//
// The model's LinearRunner shows each linear's input rows (attention q_a/q_b/q, kv_a, o_proj;
// dense and shared MLPs); the routed experts run elsewhere, so their inputs are rebuilt from
// the shared expert's input (the same normed rows) and the routing observer: expert e's
// gate/up read the rows of the tokens routed to e, its down_proj reads
// silu(gate(x)) · up(x), computed here from the same float weights. The MTP layers are
// calibrated teacher-forced: MTP layer k reads the main model's final hidden of position t
// and the true token t+1 (forward_mtp of each layer over the window).
//
// Thread-safety: one Calibrator per model, driven from one thread.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "model/deepseek_v3/deepseek_v3.h"

namespace xds {

// The running statistics of one linear's inputs x_t [cols].
struct LinearStats {
  int64_t cols = 0;
  int64_t tokens = 0;
  std::vector<double> hessian;  // [cols, cols] Σ_t x_t x_tᵀ (upper triangle until finish())
  std::vector<float> act_max;   // [cols] max_t |x_tj|

  explicit LinearStats(int64_t c = 0);
  // Adds the rows x [n, cols] (row stride ldx).
  void add(const float* x, int64_t n, int64_t ldx);
  // Mirrors the upper triangle: hessian is then the full symmetric matrix.
  void finish();
};

class Calibrator {
 public:
  // Sets the model's linear and routing observers (cleared by the destructor). Errors: a MoE
  // layer without a shared expert (its normed input would not be seen).
  static Result<std::unique_ptr<Calibrator>> attach(DeepseekV3Model& model);
  ~Calibrator();
  Calibrator(const Calibrator&) = delete;
  Calibrator& operator=(const Calibrator&) = delete;

  // Runs one window of tokens (from position 0; at least 2) through the model and its MTP
  // layers, adding every linear's inputs.
  Status run_window(std::span<const int32_t> ids);
  // Mirrors every Hessian (call once, after the last window).
  void finish();

  // By weight name ("model.layers.3.mlp.experts.7.up_proj.weight").
  const std::map<std::string, LinearStats>& stats() const { return stats_; }
  // Tokens routed to each expert: [layer][expert] for every MoE layer (MTP layers too).
  const std::map<int64_t, std::vector<int64_t>>& expert_tokens() const { return expert_tokens_; }

 private:
  explicit Calibrator(DeepseekV3Model& model) : model_(model) {}
  void on_linear(const MatrixRef& w, const float* x, int64_t n, int64_t ldx);
  void on_route(int64_t layer, int64_t token, std::span<const int32_t> ids);
  void add_expert_inputs();  // the routed experts of the step just run
  void add_names(const LayerWeights& w, int64_t layer);

  DeepseekV3Model& model_;
  std::unordered_map<const void*, std::string> names_;  // weight data -> tensor name
  std::unordered_map<const void*, int64_t> shared_gate_layer_;  // shared gate_proj -> layer
  std::map<std::string, LinearStats> stats_;
  std::map<int64_t, std::vector<int64_t>> expert_tokens_;
  // The step in flight: per MoE layer, its normed input rows [n, D] and each token's experts.
  std::map<int64_t, std::vector<float>> step_rows_;
  std::map<int64_t, std::vector<std::vector<int32_t>>> step_routes_;
};

}  // namespace xds

// GLM-4.5 / GLM-4.6 forward pass on CPU (Hugging Face's modeling_glm4_moe.py, and vLLM's
// glm4_moe_mtp.py for the MTP layers; design: docs/design/glm4_moe.md).
//
// Per decoder layer: x += o_proj(GQA(rmsnorm(x))), then x += MLP(rmsnorm(x)), the MLP a dense
// SwiGLU in layers [0, first_k_dense_replace) and a MoE after: sigmoid router with
// e_score_correction_bias and groups (DeepSeek-V3's noaux_tc), × routed_scaling_factor, plus
// the shared experts. Attention: q, k, v projections (with biases if attention_bias), an
// RMSNorm over each head of q and k if use_qk_norm, rotate-half RoPE over the first
// rotary_dim = head_dim · partial_rotary_factor dims of each head (the rest pass through),
// causal softmax at 1/sqrt(head_dim) over the paged GQA cache (gqa_kv.h), query head h reading
// KV head h / (H / KV).
//
// A step takes many sequences at different positions (GqaStep: batch order for the linears,
// attention per chunk); the routed experts run through the MoeExchange (local, or
// expert-parallel in the engine). MTP layer k is cache layer num_hidden_layers + k.
//
// Thread-safety: one step at a time (the model owns its scratch). Weights are read-only.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/causal_lm.h"
#include "model/glm4_moe/config.h"
#include "model/glm4_moe/glm4_moe_weights.h"
#include "model/gqa_step.h"
#include "model/linear_runner.h"
#include "model/rope.h"

namespace xds {

class Checkpoint;
class RepackCache;

class Glm4MoeModel final : public CausalLm {
 public:
  // Loads dir/config.json, generation_config.json and the safetensors weights. An error in
  // one line for what this family does not run: the MLA attention modes, int8 activations.
  static Result<std::unique_ptr<Glm4MoeModel>> load(const std::string& dir,
                                                    const ModelOptions& options);
  static Result<ModelInfo> load_info(const std::string& dir);
  ~Glm4MoeModel() override;

  const Glm4MoeConfig& config() const { return config_; }

  // CausalLm
  const ModelInfo& info() const override { return info_; }
  ComputeDType compute_dtype() const override { return options_.compute; }
  KvLayout kv_layout() const override { return kv_layout_; }
  Status forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) override;
  Status forward_mtp(int64_t k, std::span<const MtpChunk> chunks, KvStorage& kv,
                     StepOutput& out) override;
  void set_moe_exchange(MoeExchange* exchange) override {
    exchange_ = exchange != nullptr ? exchange : local_exchange_.get();
  }
  void set_routing_observer(RoutingObserver observer) override {
    routing_observer_ = std::move(observer);
  }
  std::span<const int64_t> routed_token_counts() const override { return routed_counts_; }
  const MoeWeights* moe_weights(int64_t layer) const override;
  ThreadPool& pool() override { return *pool_; }

  // The K/V planes' element type (ModelOptions::kv_cache resolved): kF32, kBF16 or kI8.
  DType kv_cache_dtype() const { return kv_layout_.planes[0].dtype; }

 private:
  Glm4MoeModel() = default;
  const Glm4LayerWeights& layer_weights(int64_t cache_layer) const;
  // Every MoE layer in [first, last) joins its exchange with no rows (a step with no tokens).
  Status run_empty_layers(int64_t first, int64_t last);
  Status run_layer(int64_t layer, KvStorage& kv, float* x);
  // Attention of `layer` for the step's tokens: xn [n, D] -> out [n, D] (glm4_attention.cc).
  void run_attention(const Glm4AttentionWeights& w, int64_t layer, KvStorage& kv, const float* xn,
                     float* out);
  Status run_moe(const MoeWeights& w, int64_t layer, const float* xn, float* out);
  void run_mlp(const MlpWeights& w, const float* xn, int64_t n, float* out);
  void norm_rows(const float* x, std::span<const float> weight, int64_t n, float* out);
  void embed_rows(const MatrixRef& table, std::span<const int32_t> ids, float* out) const;

  Glm4MoeConfig config_;
  ModelInfo info_;
  KvLayout kv_layout_;  // the GQA planes of every layer, the MTP layers after the decoder's
  ModelOptions options_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<RepackCache> store_;
  Glm4MoeWeights weights_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<RopeTable> rope_;  // over rotary_dim
  std::unique_ptr<LinearRunner> linear_;
  std::unique_ptr<MoeExchange> local_exchange_;
  MoeExchange* exchange_ = nullptr;
  RoutingObserver routing_observer_;
  // routed_token_counts(): [moe layers, experts]; moe_row_[cache layer] = its row (-1: dense).
  std::vector<int64_t> routed_counts_;
  std::vector<int32_t> moe_row_;

  // The step (rebuilt by forward / forward_mtp) and scratch reused across steps.
  GqaStep step_;
  GqaAttention attention_;
  std::vector<float> s_x_, s_xn_, s_tmp_;  // [n, D]
  std::vector<float> s_cat_;               // [n, 2D] the MTP layer's eh_proj input
  std::vector<float> s_q_, s_attn_;        // [n, H·Dh]
  std::vector<float> s_k_, s_v_;           // [n, KV·Dh]
  std::vector<float> s_gate_, s_up_;       // [n, MLP width]
  std::vector<float> s_router_;            // [n, E]
  std::vector<float> s_weights_;           // [n, top-k]
  std::vector<float> s_gating_;            // [threads, 2E]
  std::vector<float> s_routed_;            // [n, D]
  std::vector<int32_t> s_ids_;             // [n, top-k]
};

}  // namespace xds

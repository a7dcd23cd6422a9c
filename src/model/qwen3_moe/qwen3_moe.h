// Qwen3-MoE forward pass on CPU (Hugging Face's modeling_qwen3_moe.py; design:
// docs/design/qwen3_moe.md).
//
// Per decoder layer: x += o_proj(GQA(rmsnorm(x))), then x += MLP(rmsnorm(x)), the MLP a
// softmax-routed MoE (top-k, normalised if norm_topk_prob, no shared experts) or, in
// mlp_only_layers and between sparse steps, a dense SwiGLU. Attention: q, k, v projections,
// an RMSNorm over each head of q and of k (weights [head_dim] shared by the heads),
// rotate-half RoPE, causal softmax at 1/sqrt(head_dim) over the paged GQA cache (gqa_kv.h),
// each query head reading KV head h / (H / KV).
//
// A step takes many sequences at different positions as DeepSeek-V3's does (GqaStep: batch
// order for the linears, attention per chunk over the paged cache, gqa_step.h); the routed experts
// run through the MoeExchange (local, or expert-parallel in the engine). No MTP layers.
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
#include "model/gqa_step.h"
#include "model/kv_cache.h"
#include "model/linear_runner.h"
#include "model/qwen3_moe/config.h"
#include "model/qwen3_moe/qwen3_moe_weights.h"
#include "model/rope.h"

namespace xds {

class Checkpoint;
class RepackCache;

class Qwen3MoeModel final : public CausalLm {
 public:
  // Loads dir/config.json, generation_config.json and the safetensors weights. An error in
  // one line for what this family does not run: the MLA attention modes, int8 activations.
  static Result<std::unique_ptr<Qwen3MoeModel>> load(const std::string& dir,
                                                     const ModelOptions& options);
  static Result<ModelInfo> load_info(const std::string& dir);
  ~Qwen3MoeModel() override;

  const Qwen3MoeConfig& config() const { return config_; }

  // CausalLm
  const ModelInfo& info() const override { return info_; }
  ComputeDType compute_dtype() const override { return options_.compute; }
  KvLayout kv_layout() const override { return kv_layout_; }
  Status forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) override;
  // The family has no MTP layers: InvalidArgument.
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

  // The K/V planes' element type (ModelOptions::kv_cache resolved): kF32, kBF16 (asked for,
  // or auto with the bf16 compute dtype) or kI8 (with a scale per row).
  DType kv_cache_dtype() const { return kv_layout_.planes[0].dtype; }

 private:
  Qwen3MoeModel() = default;
  Status run_layer(int64_t layer, KvStorage& kv, float* x);
  // Attention of `layer` for the step's tokens: xn [n, D] -> out [n, D] (qwen3_attention.cc).
  void run_attention(int64_t layer, KvStorage& kv, const float* xn, float* out);
  Status run_moe(const MoeWeights& w, int64_t layer, const float* xn, float* out);
  void run_mlp(const MlpWeights& w, const float* xn, int64_t n, float* out);
  void norm_rows(const float* x, std::span<const float> weight, int64_t n, float* out);

  Qwen3MoeConfig config_;
  ModelInfo info_;
  KvLayout kv_layout_;  // the GQA planes of every layer
  ModelOptions options_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<RepackCache> store_;
  Qwen3MoeWeights weights_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<RopeTable> rope_;
  std::unique_ptr<LinearRunner> linear_;
  std::unique_ptr<MoeExchange> local_exchange_;
  MoeExchange* exchange_ = nullptr;
  RoutingObserver routing_observer_;
  // routed_token_counts(): [moe layers, experts]; moe_row_[layer] = its row (-1: dense).
  std::vector<int64_t> routed_counts_;
  std::vector<int32_t> moe_row_;

  // The step (rebuilt by forward) and scratch reused across steps (grown, never shrunk).
  GqaStep step_;
  GqaAttention attention_;
  std::vector<float> s_x_, s_xn_, s_tmp_;  // [n, D]
  std::vector<float> s_q_, s_attn_;        // [n, H·Dh]
  std::vector<float> s_k_, s_v_;           // [n, KV·Dh]
  std::vector<float> s_gate_, s_up_;       // [n, intermediate]
  std::vector<float> s_router_, s_weights_, s_gating_, s_routed_;
  std::vector<int32_t> s_ids_;
};

}  // namespace xds

// DeepSeek-V3 forward pass on CPU (semantics: docs/design/deepseek_v3_forward.md); it also runs
// Kimi K2 and DeepSeek-V2 / V2-Lite checkpoints (DeepseekFamily, config.h).
//
// One forward step takes many sequences at different positions: each TokenChunk is a run
// of consecutive tokens of one sequence (a prefill chunk, or one decode token) starting at
// `start_pos`, with the sequence's block table; the cache must already hold positions
// [0, start_pos) of that sequence. Tokens of all chunks are concatenated ("batch order") for
// the linear layers; attention runs per chunk over the paged latent cache. The KV planes
// are the MLA pair (mla_kv_layout) of every layer, the MTP layers after the decoder's.
//
// Thread-safety: a model instance runs one step at a time (it owns its scratch buffers).
// Weights are read-only and may be shared by several instances.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/phase_times.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "model/causal_lm.h"
#include "model/compute_dtype.h"
#include "model/deepseek_v3/config.h"
#include "model/deepseek_v3/deepseek_v3_weights.h"
#include "model/int8_mlp.h"
#include "model/kv_cache.h"
#include "model/linear_runner.h"
#include "model/moe_exchange.h"
#include "model/rope.h"

namespace xds {

class Checkpoint;
class RepackCache;

class DeepseekV3Model final : public CausalLm {
 public:
  // Loads dir/config.json, generation_config.json and the safetensors weights.
  static Result<std::unique_ptr<DeepseekV3Model>> load(const std::string& dir,
                                                       const ModelOptions& options);
  // The ModelInfo that load() would give, from config.json and generation_config.json alone.
  static Result<ModelInfo> load_info(const std::string& dir);
  ~DeepseekV3Model() override;

  const DeepseekV3Config& config() const { return config_; }
  const DeepseekV3Weights& weights() const { return weights_; }

  // CausalLm
  const ModelInfo& info() const override { return info_; }
  ComputeDType compute_dtype() const override { return options_.compute; }
  KvLayout kv_layout() const override;
  Status forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) override;
  Status forward_mtp(int64_t k, std::span<const MtpChunk> chunks, KvStorage& kv,
                     StepOutput& out) override;
  void set_routing_observer(RoutingObserver observer) override {
    routing_observer_ = std::move(observer);
  }
  std::span<const int64_t> routed_token_counts() const override { return routed_counts_; }
  void set_moe_exchange(MoeExchange* exchange) override {
    exchange_ = exchange != nullptr ? exchange : local_exchange_.get();
  }
  const MoeWeights* moe_weights(int64_t layer) const override;
  ThreadPool& pool() override { return *pool_; }

  // A cache with room for `max_tokens` tokens of context in total, every layer (MTP too);
  // ResourceExhausted when the machine lacks the memory (KvCache::create). A convenience for
  // callers that run sequences themselves (generate, perplexity, tests, benchmarks).
  Result<KvCache> make_cache(int64_t max_tokens, int64_t block_size = 16) const;
  // The planes' element type make_cache uses (ModelOptions::kv_cache resolved): kF32 or kBF16.
  DType kv_cache_dtype() const;
  // The rope plane's elements: kv_cache_dtype() for the float caches; an INT8 cache's rope
  // plane as the auto choice stores it (bf16 with bf16 compute where available, else fp32).
  DType kv_rope_dtype() const;

  // Shows the input rows of every linear run through the model's LinearRunner (attention,
  // dense and shared MLPs, heads; not the router or the routed experts, whose inputs are
  // the shared experts' and the routing observer's) to `observer` (calibration).
  void set_linear_observer(LinearObserver observer);

  // Times the step's phases into `times` from now on (nullptr: stop). For profiling.
  void set_phase_times(PhaseTimes* times) { phases_ = times; }

 private:
  DeepseekV3Model() = default;
  struct Batch;
  // InvalidArgument unless `kv` holds this model's planes (kv_layout()) for every layer.
  Status check_storage(const KvStorage& kv) const;
  // Appends chunk `index` to `b` (token ids and block table checked, rope table grown).
  Status append_chunk(Batch& b, size_t index, int64_t start_pos, std::span<const int32_t> tokens,
                      std::span<const int32_t> blocks, const KvStorage& kv);
  // A step with no tokens: the MoE layers among cache layers [first_layer, end_layer) join
  // their exchange with no rows, in order.
  Status run_empty_step(int64_t first_layer, int64_t end_layer);
  Status run_layer(const LayerWeights& w, int64_t cache_layer, const Batch& b, KvStorage& kv,
                   float* x);
  void run_attention(const MlaWeights& w, int64_t cache_layer, const Batch& b, KvStorage& kv,
                     const float* xn, float* out);
  Status run_moe(const MoeWeights& w, int64_t layer, const Batch& b, const float* xn, float* out);
  void run_mlp(const MlpWeights& w, const float* xn, int64_t n, float* out);
  // fn over rows [0, n): on the pool from kPoolMinRows rows (deepseek_v3.cc), else inline.
  void for_rows(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);
  // dst[t] += src[t] for n rows of hidden_size, split over the pool.
  void add_rows(const float* src, int64_t n, float* dst);
  // Whether a step of n tokens runs `shared` between the routed experts.
  bool overlaps_shared(const MlpWeights& shared, int64_t n) const;
  void linear(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy);
  void embed_rows(const MatrixRef& table, std::span<const int32_t> ids, float* out);
  void logits_for(const float* hidden_normed, int64_t rows, const MatrixRef& head, StepOutput& out);

  DeepseekV3Config config_;
  ModelInfo info_;
  KvLayout kv_layout_;  // the MLA planes of every cache layer
  ModelOptions options_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<RepackCache> store_;
  DeepseekV3Weights weights_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<RopeTable> rope_;
  std::unique_ptr<LinearRunner> linear_;  // the compute dtype's linear (owns its bf16 scratch)
  std::unique_ptr<MoeExchange> local_exchange_;
  MoeExchange* exchange_ = nullptr;
  RoutingObserver routing_observer_;
  // routed_token_counts(): [moe layers, experts]; moe_row_[cache layer] = its row (-1: dense).
  std::vector<int64_t> routed_counts_;
  std::vector<int32_t> moe_row_;
  PhaseTimes* phases_ = nullptr;
  ThreadPool inline_pool_{1};  // for linear calls made inside a parallel region

  // Scratch reused across steps (grown, never shrunk).
  std::unique_ptr<Batch> batch_;  // the step's chunks and positions
  std::vector<float> s_x_, s_xn_, s_tmp_, s_q_, s_qa_, s_kva_, s_qabs_, s_lat_, s_attn_;
  std::vector<float> s_gather_, s_kvfull_, s_rope_, s_gate_, s_up_, s_scores_, s_routed_, s_router_;
  Int8MlpScratch s_int8_mlp_;  // W8A8 dense and shared MLPs
  std::vector<int32_t> s_ids_, s_token_chunk_;
  std::vector<int64_t> s_absorbed_;
  std::vector<std::pair<int64_t, int64_t>> s_runs_;
  struct AbsorbedItem {               // absorbed attention: one token × one part of its context
    int64_t token, begin, end, slot;  // slot: index of its partial sums, -1 if whole
  };
  struct AbsorbedUnit {  // what one thread claims: items [first, first + count) of a token
    int64_t first, count;
  };
  struct AbsorbedMerge {  // a token of several parts: slots [first_slot, first_slot + count)
    int64_t token, first_slot, count;
  };
  std::vector<AbsorbedItem> s_items_;
  std::vector<AbsorbedUnit> s_units_;
  std::vector<AbsorbedMerge> s_merges_;
  std::vector<float> s_part_out_, s_part_ml_;
  std::vector<float> s_weights_, s_gating_;
};

}  // namespace xds

// CausalLm: the narrow interface between the serving engine and a model architecture.
//
// The engine sees what it needs to schedule, size the KV cache and run steps: the model's
// facts (ModelInfo), the KV planes of each layer (kv_layout), and the forward passes over a
// KvStorage whose blocks it allocates itself (BlockAllocator). load_causal_lm (registry.h)
// picks the implementation from config.json's model_type; adding an architecture is one file
// implementing this class plus one row in the registry's table.
//
// Thread-safety: an instance runs one step (forward or forward_mtp) at a time on its own
// pool; the setters are called between steps. Weights are read-only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/compute_dtype.h"
#include "model/kv_storage.h"
#include "model/moe_exchange.h"
#include "model/moe_routing.h"
#include "model/step_io.h"

namespace xds {

struct MoeWeights;

// How prefill attention is computed: weight-absorbed over the latent cache, or expanded
// (K/V materialised through kv_b_proj). kAuto picks the cheaper per chunk by FLOPs.
enum class AttentionMode { kAuto, kAbsorbed, kExpanded };

// Element type of the KV cache's planes (vLLM's --kv-cache-dtype). kAuto: bf16 where the
// fast mode's absorbed attention reads bf16 planes (compute kBF16 and
// kernels::absorbed_bf16_available(): it rounds every cached row to bf16 anyway, so half the
// bytes give the same decode products; the prefill's expanded form then sees the rope part
// rounded too), fp32 otherwise. kBF16 elsewhere is refused by load(). kInt8: the latent
// plane in INT8 with an absmax scale per row, the rope plane as kAuto would store it (bf16
// or fp32); every attention path reads the dequantized stored rows (kv_storage.h).
enum class KvCacheDType { kAuto, kF32, kBF16, kInt8 };

// The linears' activations against integer weights: kAuto, as the checkpoint's
// quantization_config says (W4A16 float, W4A8 and W8A8 int8 per token); kInt8, a W4A16
// checkpoint's int4 linears run as W4A8 (per-token int8 activations, logged once at load).
// kInt8 with a checkpoint that has no integer weights is refused by load().
enum class ActivationDType { kAuto, kInt8 };

struct ModelOptions {
  ComputeDType compute = ComputeDType::kF32;
  ActivationDType activation = ActivationDType::kAuto;
  KvCacheDType kv_cache = KvCacheDType::kAuto;
  AttentionMode attention = AttentionMode::kAuto;
  int threads = 0;  // 0: all cores
  // Shared experts in slices between the routed ones (SharedMlpOverlap) where the model
  // allows it; off (the default): always after them. Both give the same bits. Off since the
  // weights sit in 2 MB pages: the routed experts then stream fast enough that the slices
  // between them cost more than they hide (docs/design/cpu_kernels.md, "Experts").
  bool overlap_shared = false;
};

// What the engine knows of a model: sizes, layers, tokens, and its MoE (what the expert
// exchange, the expert slots, EPLB and gating need), whatever the family. A dense model has
// no moe_layers and n_routed_experts 0.
struct ModelInfo {
  std::string model_type;  // config.json's model_type ("deepseek_v3", "kimi_k2", ...)
  std::string name;        // the checkpoint directory's last path component
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;    // decoder layers (cache layers [0, num_layers))
  int64_t n_mtp_layers = 0;  // MTP layers (cache layers [num_layers, num_layers + n_mtp_layers))
  int64_t n_routed_experts = 0;   // E, per MoE layer
  int64_t experts_per_token = 0;  // top-k
  std::vector<int64_t> moe_layers;  // cache-layer ids of the MoE layers, ascending, MTP included
  // The router's rule of every MoE layer (score, top-k method, groups, normalisation,
  // scaling); gating.num_experts == n_routed_experts, gating.top_k == experts_per_token.
  GatingParams gating;
  int64_t expert_intermediate_size = 0;  // I: a routed expert's MLP width
  int64_t n_shared_experts = 0;          // shared experts of each MoE layer (0: none)
  int64_t shared_intermediate_size = 0;  // their MLP's width (n_shared_experts * I)
  int64_t max_position_embeddings = 0;
  std::vector<int64_t> eos_token_ids;  // generation_config.json (else config.json)
  std::optional<int64_t> bos_token_id;
};

class CausalLm {
 public:
  virtual ~CausalLm() = default;

  virtual const ModelInfo& info() const = 0;
  virtual ComputeDType compute_dtype() const = 0;
  // The planes of every cache layer (decoder then MTP layers), for KvStorage and transfers.
  virtual KvLayout kv_layout() const = 0;

  // Runs the main model over `chunks` (TokenChunk: each carries its block table; the cache's
  // rows are written at the chunks' positions). Logits for each chunk's last token (or every
  // token with all_logits) in out.logits, the final-normed hidden of every token in
  // out.hidden. InvalidArgument naming the chunk when a block table does not cover its
  // positions or holds an id outside the storage, or a token id is out of range; nothing is
  // written then. No chunks (or no tokens) is a valid step: every MoE layer still runs its
  // exchange with no rows, in layer order (an expert-parallel device with no requests joins
  // every dispatch and combine), and the outputs are empty.
  virtual Status forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) = 0;
  // Runs MTP layer k (0-based) over `chunks`; out.logits gets one row per MTP row, and
  // out.hidden the layer's residual output of every row before shared_head.norm ([rows, D],
  // batch order): the input hidden of a chained draft (MtpChunk::hidden of the next row, as
  // vLLM chains its MTP drafts). A chunk's hidden may point into `out.hidden` itself (it is
  // read before out is written). No rows: as forward (the layer's exchange runs with none;
  // the outputs are empty).
  virtual Status forward_mtp(int64_t k, std::span<const MtpChunk> chunks, KvStorage& kv,
                             StepOutput& out) = 0;

  // Replaces the local expert computation (expert parallelism, disaggregation); nullptr
  // restores it. The exchange must outlive its use.
  virtual void set_moe_exchange(MoeExchange* exchange) = 0;
  virtual void set_routing_observer(RoutingObserver observer) = 0;
  // Tokens routed to each logical expert since load (EPLB's Collect step, P068), cumulative:
  // [info().moe_layers.size(), n_routed_experts] row-major, rows in moe_layers order. Counted
  // by forward/forward_mtp after gating, on the stepping thread (no allocation, no
  // synchronisation); read between steps.
  virtual std::span<const int64_t> routed_token_counts() const = 0;
  // The routed-expert weights of a cache layer (nullptr for a dense one): what an exchange
  // binds its expert slots to (bind_expert_slots, grouped_experts.h).
  virtual const MoeWeights* moe_weights(int64_t layer) const = 0;
  virtual ThreadPool& pool() = 0;

  // Called on the stepping thread after each decoder layer that forward or forward_mtp runs
  // (the MTP layer and steps with no tokens included), with `context` and the cache layer:
  // what lets a caller's loop answer a heartbeat inside a long step. The callback must not
  // call into the model. nullptr (the default) calls nothing; an unset callback costs one
  // branch per layer. Set between steps.
  using LayerCallback = void (*)(void* context, int64_t layer);
  void set_layer_callback(LayerCallback fn, void* context) {
    layer_callback_ = fn;
    layer_context_ = context;
  }

 protected:
  // An implementation calls this after each layer it runs.
  void after_layer(int64_t layer) const {
    if (layer_callback_ != nullptr) layer_callback_(layer_context_, layer);
  }

 private:
  LayerCallback layer_callback_ = nullptr;
  void* layer_context_ = nullptr;
};

}  // namespace xds

#include "model/deepseek_v3/deepseek_v3.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/grow.h"
#include "base/log.h"
#include "kernels/cpu/int8_matrix.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/ops.h"
#include "model/config_json.h"
#include "model/deepseek_v3/deepseek_v3_batch.h"
#include "model/linear_runner.h"
#include "model/local_moe.h"
#include "model/model_runtime.h"
#include "model/moe_routing.h"
#include "model/safetensors.h"
#include "model/shared_mlp_overlap.h"
#include "model/weights.h"

namespace xds {
namespace {

// Rows from which the elementwise passes of a step (residual adds, routing) go to the pool:
// below, waking it costs more than the work.
constexpr int64_t kPoolMinRows = 32;

}  // namespace

DeepseekV3Model::~DeepseekV3Model() = default;

namespace {

ModelInfo make_info(const std::string& dir, const DeepseekV3Config& c) {
  ModelInfo info;
  info.model_type = deepseek_model_type(c.family);
  info.name = config_json::checkpoint_name(dir);
  info.vocab_size = c.vocab_size;
  info.hidden_size = c.hidden_size;
  info.num_layers = c.num_hidden_layers;
  info.n_mtp_layers = c.num_nextn_predict_layers;
  info.n_routed_experts = c.n_routed_experts;
  info.experts_per_token = c.num_experts_per_tok;
  for (int64_t l = 0; l < c.num_hidden_layers + c.num_nextn_predict_layers; ++l) {
    if (c.is_moe_layer(l)) info.moe_layers.push_back(l);
  }
  info.gating = gating_params(c);
  info.expert_intermediate_size = c.moe_intermediate_size;
  info.n_shared_experts = c.n_shared_experts;
  info.shared_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  info.max_position_embeddings = c.max_position_embeddings;
  info.eos_token_ids = c.eos_token_ids;
  info.bos_token_id = c.bos_token_id;
  return info;
}

}  // namespace

Result<ModelInfo> DeepseekV3Model::load_info(const std::string& dir) {
  XDS_ASSIGN_OR_RETURN(const DeepseekV3Config config, load_deepseek_v3_config(dir));
  return make_info(dir, config);
}

Result<std::unique_ptr<DeepseekV3Model>> DeepseekV3Model::load(const std::string& dir,
                                                               const ModelOptions& options) {
  std::unique_ptr<DeepseekV3Model> m(new DeepseekV3Model());
  XDS_ASSIGN_OR_RETURN(m->config_, load_deepseek_v3_config(dir));
  m->options_ = options;
  if (options.activation == ActivationDType::kInt8) {
    if (!m->config_.int_quant) {
      return invalid_argument(
          "{}/config.json: activation dtype int8 needs integer weights (a W4A16, W4A8 or W8A8 "
          "quantization_config); this checkpoint has none",
          dir);
    }
    if (m->config_.int_quant->scheme == IntScheme::kW4A16) {
      m->config_.int_quant->scheme = IntScheme::kW4A8;
      XDS_LOG_INFO(
          "{}: W4A16 checkpoint run as W4A8 (activation dtype int8: per-token int8 "
          "activations)",
          dir);
    }
  }
  if (options.kv_cache == KvCacheDType::kBF16 &&
      (options.compute != ComputeDType::kBF16 || !kernels::absorbed_bf16_available())) {
    return invalid_argument(
        "a bf16 KV cache needs the bf16 compute dtype on a CPU with AVX512_BF16 (its only "
        "reader is that mode's attention kernel); compute dtype is {}, AVX512_BF16 kernel {}",
        options.compute == ComputeDType::kBF16 ? "bf16" : "f32",
        kernels::absorbed_bf16_available() ? "available" : "not available");
  }
  XDS_ASSIGN_OR_RETURN(ModelRuntime rt, open_model_runtime(dir, options));
  m->pool_ = std::move(rt.pool);
  m->checkpoint_ = std::move(rt.checkpoint);
  m->store_ = std::move(rt.store);
  XDS_ASSIGN_OR_RETURN(m->weights_,
                       bind_deepseek_v3_weights(m->config_, *m->checkpoint_, *m->store_));
  m->store_->finish_progress();
  m->rope_ = std::make_unique<RopeTable>(rope_params(m->config_));
  m->linear_ = std::make_unique<LinearRunner>(options.compute, *m->pool_);
  std::vector<const MoeWeights*> moe_layers;
  for (int64_t l = 0; l < m->config_.num_hidden_layers + m->config_.num_nextn_predict_layers; ++l)
    moe_layers.push_back(m->moe_weights(l));
  m->local_exchange_ = make_owned_local_moe(std::move(moe_layers), m->config_.hidden_size,
                                          options.compute, *m->pool_);
  m->exchange_ = m->local_exchange_.get();
  m->batch_ = std::make_unique<Batch>();
  m->info_ = make_info(dir, m->config_);
  m->moe_row_.assign(
      static_cast<size_t>(m->config_.num_hidden_layers + m->config_.num_nextn_predict_layers), -1);
  for (size_t i = 0; i < m->info_.moe_layers.size(); ++i)
    m->moe_row_[static_cast<size_t>(m->info_.moe_layers[i])] = static_cast<int32_t>(i);
  m->routed_counts_.assign(
      m->info_.moe_layers.size() * static_cast<size_t>(m->config_.n_routed_experts), 0);
  const int64_t cache_layers = m->config_.num_hidden_layers + m->config_.num_nextn_predict_layers;
  m->kv_layout_ =
      m->kv_cache_dtype() == DType::kI8
          ? mla_int8_kv_layout(cache_layers, m->config_.kv_lora_rank,
                               m->config_.qk_rope_head_dim, m->kv_rope_dtype())
          : mla_kv_layout(cache_layers, m->config_.kv_lora_rank, m->config_.qk_rope_head_dim,
                          m->kv_cache_dtype());
  return m;
}

Result<KvCache> DeepseekV3Model::make_cache(int64_t max_tokens, int64_t block_size) const {
  KvCacheShape s;
  s.layers = config_.num_hidden_layers + config_.num_nextn_predict_layers;
  s.block_size = block_size;
  s.num_blocks = block_size > 0 ? (max_tokens + block_size - 1) / block_size : 0;
  s.latent_dim = config_.kv_lora_rank;
  s.rope_dim = config_.qk_rope_head_dim;
  s.dtype = kv_cache_dtype();
  s.rope_dtype = kv_rope_dtype();
  return KvCache::create(s);
}

KvLayout DeepseekV3Model::kv_layout() const {
  return kv_layout_;
}

const MoeWeights* DeepseekV3Model::moe_weights(int64_t layer) const {
  const int64_t main = config_.num_hidden_layers;
  if (layer < 0 || layer >= main + static_cast<int64_t>(weights_.mtp.size())) return nullptr;
  const LayerWeights& w = layer < main ? weights_.layers[layer] : weights_.mtp[layer - main].layer;
  return w.moe ? &*w.moe : nullptr;
}

DType DeepseekV3Model::kv_cache_dtype() const {
  switch (options_.kv_cache) {
    case KvCacheDType::kF32:
      return DType::kF32;
    case KvCacheDType::kBF16:
      return DType::kBF16;
    case KvCacheDType::kInt8:
      return DType::kI8;
    case KvCacheDType::kAuto:
      break;
  }
  const bool bf16 = options_.compute == ComputeDType::kBF16 && kernels::absorbed_bf16_available();
  return bf16 ? DType::kBF16 : DType::kF32;
}

DType DeepseekV3Model::kv_rope_dtype() const {
  if (options_.kv_cache == KvCacheDType::kF32) return DType::kF32;
  const bool bf16 = options_.compute == ComputeDType::kBF16 && kernels::absorbed_bf16_available();
  return bf16 || options_.kv_cache == KvCacheDType::kBF16 ? DType::kBF16 : DType::kF32;
}

void DeepseekV3Model::linear(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                             int64_t ldy) {
  (*linear_)(x, n, ldx, w, y, ldy);
}

void DeepseekV3Model::set_linear_observer(LinearObserver observer) {
  linear_->set_observer(std::move(observer));
}

void DeepseekV3Model::embed_rows(const MatrixRef& table, std::span<const int32_t> ids, float* out) {
  const int64_t d = table.cols;
  for (size_t t = 0; t < ids.size(); ++t) {
    float* row = out + static_cast<int64_t>(t) * d;
    if (table.dtype == DType::kBF16) {
      const uint16_t* src = static_cast<const uint16_t*>(table.data) + ids[t] * d;
      for (int64_t i = 0; i < d; ++i) row[i] = bf16_to_f32(src[i]);
    } else {
      std::memcpy(row, static_cast<const float*>(table.data) + ids[t] * d, sizeof(float) * d);
    }
  }
}

void DeepseekV3Model::run_mlp(const MlpWeights& w, const float* xn, int64_t n, float* out) {
  const int64_t d = config_.hidden_size, width = w.gate_proj.rows;
  if (is_int8_mlp(w)) {  // W8A8: x quantized once, gate and up in one kernel (int8_mlp.h)
    kernels::quantize_rows_int8_on_pool(xn, n, d, d, s_int8_mlp_.x, *pool_);
    int8_mlp(w, s_int8_mlp_.x.ref(), out, d, s_int8_mlp_, pool_.get());
    return;
  }
  float* gate = grow(s_gate_, n * width);
  float* up = grow(s_up_, n * width);
  const kernels::LinearOutput gate_up[] = {{&w.gate_proj, gate, width}, {&w.up_proj, up, width}};
  linear_->group(xn, n, d, gate_up);
  pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    kernels::silu_mul(gate + t0 * width, up + t0 * width, (t1 - t0) * width, gate + t0 * width);
  });
  linear(gate, n, width, w.down_proj, out, d);
}

bool DeepseekV3Model::overlaps_shared(const MlpWeights& shared, int64_t n) const {
  // Overlap can pay only while the shared MLP is compute-bound (8+ tokens) and the routed
  // experts memory-bound (on average at most 4 tokens per expert); past that it runs after
  // the routed experts. With the weights in 2 MB pages the routed experts stream fast enough
  // that it does not pay at all, so ModelOptions::overlap_shared is off unless asked for
  // (docs/design/cpu_kernels.md, "Experts").
  constexpr int64_t kMinTokens = 8, kMaxTokensPerExpert = 4;
  return options_.overlap_shared && n >= kMinTokens &&
         n * config_.num_experts_per_tok <= kMaxTokensPerExpert * config_.n_routed_experts &&
         SharedMlpOverlap::supported(shared);
}

Status DeepseekV3Model::run_moe(const MoeWeights& w, int64_t layer, const Batch& b, const float* xn,
                                float* out) {
  const int64_t n = b.n, d = config_.hidden_size, e = config_.n_routed_experts;
  const int64_t k = config_.num_experts_per_tok;
  // Router in fp32 in every compute mode: routing decisions must not move with the fast mode.
  std::optional<ScopedPhase> phase(std::in_place, phases_, "moe.router");
  float* logits = grow(s_router_, n * e);
  kernels::linear_f32(xn, n, d, w.router, logits, e, *pool_);
  int32_t* ids = grow(s_ids_, n * k);
  float* weights = grow(s_weights_, n * k);
  const GatingParams& gp = info_.gating;
  const float* bias = w.score_bias.empty() ? nullptr : w.score_bias.data();
  // A token's routing reads only its own logits: any thread, same result.
  float* scratch_all = grow(s_gating_, 2 * e * pool_->num_threads());
  for_rows(n, [&](int64_t t0, int64_t t1, int thread) {
    float* scratch = scratch_all + 2 * e * thread;
    for (int64_t t = t0; t < t1; ++t)
      route_token(gp, logits + t * e, bias, ids + t * k, weights + t * k, scratch);
  });
  int64_t* counts = routed_counts_.data() + moe_row_[static_cast<size_t>(layer)] * e;
  for (int64_t i = 0; i < n * k; ++i) ++counts[ids[i]];
  if (routing_observer_) {  // tokens in order, on this thread
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> sorted(ids + t * k, ids + (t + 1) * k);
      std::sort(sorted.begin(), sorted.end());
      routing_observer_(layer, t, sorted);
    }
  }
  float* routed = grow(s_routed_, n * d);
  MoeExchangeInput in{layer, xn, n, ids, weights, k, routed};
  // The shared experts (compute-bound from a few tokens on) between the routed ones
  // (memory-bound at decode), when they can run in slices; else after them.
  std::optional<SharedMlpOverlap> shared;
  if (w.shared && overlaps_shared(*w.shared, n)) {
    const int64_t width = w.shared->gate_proj.rows;
    shared.emplace(*w.shared, xn, n, grow(s_gate_, n * width), grow(s_up_, n * width), out,
                   SharedMlpOverlap::kSliceFlops, options_.compute == ComputeDType::kBF16);
    in.overlap = &*shared;
  }
  phase.emplace(phases_, "moe.experts");  // with the shared experts when overlapped
  XDS_RETURN_IF_ERROR(exchange_->run(in));
  phase.emplace(phases_, "moe.shared");
  if (w.shared) {
    if (!shared) run_mlp(*w.shared, xn, n, out);
    add_rows(routed, n, out);
  } else {
    std::memcpy(out, routed, sizeof(float) * static_cast<size_t>(n * d));
  }
  return {};
}

void DeepseekV3Model::for_rows(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n < kPoolMinRows) return fn(0, n, 0);
  pool_->parallel_for(n, fn);
}

void DeepseekV3Model::add_rows(const float* src, int64_t n, float* dst) {
  const int64_t d = config_.hidden_size;
  for_rows(n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t i = t0 * d; i < t1 * d; ++i) dst[i] += src[i];
  });
}

Status DeepseekV3Model::run_layer(const LayerWeights& w, int64_t cache_layer, const Batch& b,
                                  KvStorage& kv, float* x) {
  const int64_t n = b.n, d = config_.hidden_size;
  const double eps = config_.rms_norm_eps;
  float* xn = grow(s_xn_, n * d);
  float* tmp = grow(s_tmp_, n * d);
  auto norm_rows = [&](std::span<const float> weight) {
    pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t)
        kernels::rmsnorm(x + t * d, weight.data(), d, eps, xn + t * d);
    });
  };
  {
    ScopedPhase phase(phases_, "norm+residual");
    norm_rows(w.input_norm);
  }
  run_attention(w.attn, cache_layer, b, kv, xn, tmp);
  {
    ScopedPhase phase(phases_, "norm+residual");
    add_rows(tmp, n, x);
    norm_rows(w.post_attn_norm);
  }
  if (w.dense) {
    ScopedPhase phase(phases_, "dense_mlp");
    run_mlp(*w.dense, xn, n, tmp);
  } else {
    XDS_RETURN_IF_ERROR(run_moe(*w.moe, cache_layer, b, xn, tmp));
  }
  ScopedPhase phase(phases_, "norm+residual");
  add_rows(tmp, n, x);
  return {};
}

void DeepseekV3Model::logits_for(const float* hidden_normed, int64_t rows, const MatrixRef& head,
                                 StepOutput& out) {
  ScopedPhase phase(phases_, "lm_head");
  const int64_t v = config_.vocab_size;
  out.logits.resize(static_cast<size_t>(rows * v));
  linear(hidden_normed, rows, config_.hidden_size, head, out.logits.data(), v);
}

namespace {

Status check_tokens(std::span<const int32_t> tokens, int64_t vocab, size_t chunk) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return invalid_argument("chunk {}: token {} is id {}, out of range [0, {})", chunk, i,
                              tokens[i], vocab);
    }
  }
  return {};
}

}  // namespace

Status DeepseekV3Model::check_storage(const KvStorage& kv) const {
  const KvLayout& want = kv_layout_;
  const KvLayout& have = kv.layout();
  const auto same = [](const KvPlane& a, const KvPlane& b) {
    return a.dtype == b.dtype && a.elements == b.elements && a.row_bytes == b.row_bytes;
  };
  if (have.layers < want.layers || have.planes.size() != want.planes.size() ||
      !std::equal(want.planes.begin(), want.planes.end(), have.planes.begin(), same)) {
    return invalid_argument(
        "KV storage of {} layers x {} planes (latent {} x {}) does not fit this model: {} layers "
        "of latent {} x {} and rope {}",
        have.layers, have.planes.size(), have.planes.empty() ? 0 : have.planes[0].elements,
        have.planes.empty() ? "-" : dtype_name(have.planes[0].dtype), want.layers,
        want.planes[0].elements, dtype_name(want.planes[0].dtype), want.planes[1].elements);
  }
  return {};
}

Status DeepseekV3Model::append_chunk(Batch& b, size_t index, int64_t start_pos,
                                     std::span<const int32_t> tokens,
                                     std::span<const int32_t> blocks, const KvStorage& kv) {
  XDS_RETURN_IF_ERROR(check_tokens(tokens, config_.vocab_size, index));
  const int64_t count = static_cast<int64_t>(tokens.size());
  if (start_pos < 0) return invalid_argument("chunk {}: start position {} < 0", index, start_pos);
  const int64_t end = start_pos + count, bs = kv.block_size();
  const int64_t need = (end + bs - 1) / bs;
  if (static_cast<int64_t>(blocks.size()) < need) {
    return invalid_argument(
        "chunk {}: positions [{}, {}) need {} blocks of {} rows, its block table has {}", index,
        start_pos, end, need, bs, blocks.size());
  }
  for (int64_t i = 0; i < need; ++i) {
    if (blocks[i] < 0 || blocks[i] >= kv.num_blocks()) {
      return invalid_argument("chunk {}: block table entry {} is block {}, outside [0, {})", index,
                              i, blocks[i], kv.num_blocks());
    }
  }
  b.chunks.push_back({blocks, start_pos, b.n, count});
  for (int64_t i = 0; i < count; ++i) b.pos.push_back(start_pos + i);
  b.n += count;
  return {};
}

Status DeepseekV3Model::run_empty_step(int64_t first_layer, int64_t end_layer) {
  for (int64_t l = first_layer; l < end_layer; ++l) {
    if (moe_weights(l) != nullptr) {
      MoeExchangeInput in;
      in.layer = l;
      in.top_k = config_.num_experts_per_tok;
      XDS_RETURN_IF_ERROR(exchange_->run(in));
    }
    after_layer(l);
  }
  return {};
}

Status DeepseekV3Model::forward(std::span<const TokenChunk> chunks, KvStorage& kv,
                                StepOutput& out) {
  const int64_t d = config_.hidden_size;
  XDS_RETURN_IF_ERROR(check_storage(kv));
  Batch& b = *batch_;
  b.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const TokenChunk& ch = chunks[i];
    XDS_RETURN_IF_ERROR(append_chunk(b, i, ch.start_pos, ch.tokens, ch.blocks, kv));
  }
  out.logit_tokens.clear();
  if (b.n == 0) {
    out.logits.clear();
    out.hidden.clear();
    return run_empty_step(0, config_.num_hidden_layers);
  }
  for (const Batch::Chunk& ch : b.chunks) rope_->ensure(ch.start_pos + ch.count);
  float* x = grow(s_x_, b.n * d);
  int64_t at = 0;
  for (const TokenChunk& ch : chunks) {
    embed_rows(weights_.embed, ch.tokens, x + at * d);
    at += static_cast<int64_t>(ch.tokens.size());
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    XDS_RETURN_IF_ERROR(run_layer(weights_.layers[l], l, b, kv, x));
    after_layer(l);
  }
  out.hidden.resize(static_cast<size_t>(b.n * d));
  pool_->parallel_for(b.n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      kernels::rmsnorm(x + t * d, weights_.final_norm.data(), d, config_.rms_norm_eps,
                       out.hidden.data() + t * d);
    }
  });
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Batch::Chunk& ch = b.chunks[i];
    if (ch.count == 0) continue;
    for (int64_t t = chunks[i].all_logits ? 0 : ch.count - 1; t < ch.count; ++t)
      out.logit_tokens.push_back(ch.begin + t);
  }
  const int64_t rows = static_cast<int64_t>(out.logit_tokens.size());
  float* hn = grow(s_xn_, rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(hn + r * d, out.hidden.data() + out.logit_tokens[r] * d, sizeof(float) * d);
  }
  logits_for(hn, rows, weights_.lm_head, out);
  return {};
}

Status DeepseekV3Model::forward_mtp(int64_t k, std::span<const MtpChunk> chunks, KvStorage& kv,
                                    StepOutput& out) {
  if (k < 0 || k >= config_.num_nextn_predict_layers) {
    return invalid_argument("MTP layer {} requested, the model has {}", k,
                            config_.num_nextn_predict_layers);
  }
  const MtpWeights& w = weights_.mtp[k];
  const int64_t d = config_.hidden_size, layer = config_.num_hidden_layers + k;
  XDS_RETURN_IF_ERROR(check_storage(kv));
  Batch& b = *batch_;
  b.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const MtpChunk& ch = chunks[i];
    XDS_RETURN_IF_ERROR(append_chunk(b, i, ch.start_pos, ch.next_tokens, ch.blocks, kv));
    if (!ch.next_tokens.empty() && ch.hidden == nullptr) {
      return invalid_argument("MTP chunk {}: {} rows without a hidden state", i,
                              ch.next_tokens.size());
    }
  }
  out.logit_tokens.clear();
  if (b.n == 0) {
    out.logits.clear();
    out.hidden.clear();
    return run_empty_step(layer, layer + 1);
  }
  for (const Batch::Chunk& ch : b.chunks) rope_->ensure(ch.start_pos + ch.count);
  // cat: [n, 2D] = [enorm(embed(next)); hnorm(hidden)]
  float* cat = grow(s_gather_, b.n * 2 * d);
  float* e = grow(s_tmp_, b.n * d);
  int64_t at = 0;
  for (const MtpChunk& ch : chunks) {
    embed_rows(w.embed, ch.next_tokens, e + at * d);
    for (size_t i = 0; i < ch.next_tokens.size(); ++i, ++at) {
      kernels::rmsnorm(e + at * d, w.enorm.data(), d, config_.rms_norm_eps, cat + at * 2 * d);
      kernels::rmsnorm(ch.hidden + static_cast<int64_t>(i) * d, w.hnorm.data(), d,
                       config_.rms_norm_eps, cat + at * 2 * d + d);
    }
  }
  float* x = grow(s_x_, b.n * d);
  linear(cat, b.n, 2 * d, w.eh_proj, x, d);
  XDS_RETURN_IF_ERROR(run_layer(w.layer, layer, b, kv, x));
  after_layer(layer);
  // The residual output before shared_head.norm: the input hidden of a chained draft. The
  // chunks' hidden rows were consumed into `cat` above, so they may point into out.hidden.
  out.hidden.assign(x, x + b.n * d);
  float* hn = grow(s_xn_, b.n * d);
  for (int64_t t = 0; t < b.n; ++t)
    kernels::rmsnorm(x + t * d, w.head_norm.data(), d, config_.rms_norm_eps, hn + t * d);
  out.logit_tokens.resize(static_cast<size_t>(b.n));
  for (int64_t t = 0; t < b.n; ++t) out.logit_tokens[t] = t;
  logits_for(hn, b.n, w.head, out);
  return {};
}

}  // namespace xds

#include "model/glm4_moe/glm4_moe.h"

#include <algorithm>
#include <cstring>

#include "base/bf16.h"
#include "base/grow.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "model/config_json.h"
#include "model/gqa_kv.h"
#include "model/local_moe.h"
#include "model/model_runtime.h"
#include "model/moe_routing.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace xds {
namespace {

ModelInfo make_info(const std::string& dir, const Glm4MoeConfig& c) {
  ModelInfo info;
  info.model_type = "glm4_moe";
  info.name = config_json::checkpoint_name(dir);
  info.vocab_size = c.vocab_size;
  info.hidden_size = c.hidden_size;
  info.num_layers = c.num_hidden_layers;
  info.n_mtp_layers = c.num_nextn_predict_layers;
  for (int64_t l = 0; l < c.num_hidden_layers + c.num_nextn_predict_layers; ++l) {
    if (c.is_moe_layer(l)) info.moe_layers.push_back(l);
  }
  info.n_routed_experts = c.n_routed_experts;
  info.experts_per_token = c.num_experts_per_tok;
  info.gating = gating_params(c);
  info.expert_intermediate_size = c.moe_intermediate_size;
  info.n_shared_experts = c.n_shared_experts;
  info.shared_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  info.max_position_embeddings = c.max_position_embeddings;
  info.eos_token_ids = c.eos_token_ids;
  info.bos_token_id = c.bos_token_id;
  return info;
}

// The options this family does not run yet, each refused in one line.
Status check_options(const ModelOptions& o) {
  if (o.attention != AttentionMode::kAuto) {
    return invalid_argument(
        "GLM-4.5: --attention absorbed/expanded are MLA modes; this model has GQA attention "
        "(leave it auto)");
  }
  if (o.activation == ActivationDType::kInt8) {
    return unimplemented(
        "GLM-4.5: --activation-dtype int8 needs integer weights, which this family does not "
        "load yet");
  }
  return {};
}

}  // namespace

Glm4MoeModel::~Glm4MoeModel() = default;

Result<ModelInfo> Glm4MoeModel::load_info(const std::string& dir) {
  XDS_ASSIGN_OR_RETURN(const Glm4MoeConfig config, load_glm4_moe_config(dir));
  return make_info(dir, config);
}

Result<std::unique_ptr<Glm4MoeModel>> Glm4MoeModel::load(const std::string& dir,
                                                         const ModelOptions& options) {
  XDS_RETURN_IF_ERROR(check_options(options));
  std::unique_ptr<Glm4MoeModel> m(new Glm4MoeModel());
  XDS_ASSIGN_OR_RETURN(m->config_, load_glm4_moe_config(dir));
  const Glm4MoeConfig& c = m->config_;
  m->options_ = options;
  XDS_ASSIGN_OR_RETURN(ModelRuntime rt, open_model_runtime(dir, options));
  m->pool_ = std::move(rt.pool);
  m->checkpoint_ = std::move(rt.checkpoint);
  m->store_ = std::move(rt.store);
  XDS_ASSIGN_OR_RETURN(m->weights_, bind_glm4_moe_weights(c, *m->checkpoint_, *m->store_));
  m->store_->finish_progress();
  m->rope_ = std::make_unique<RopeTable>(rope_params(c));
  m->linear_ = std::make_unique<LinearRunner>(options.compute, *m->pool_);
  const int64_t cache_layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  std::vector<const MoeWeights*> moe_layers;
  for (int64_t l = 0; l < cache_layers; ++l) moe_layers.push_back(m->moe_weights(l));
  m->local_exchange_ = make_owned_local_moe(std::move(moe_layers), c.hidden_size,
                                          options.compute, *m->pool_);
  m->exchange_ = m->local_exchange_.get();
  m->info_ = make_info(dir, c);
  m->moe_row_.assign(static_cast<size_t>(cache_layers), -1);
  for (size_t i = 0; i < m->info_.moe_layers.size(); ++i)
    m->moe_row_[static_cast<size_t>(m->info_.moe_layers[i])] = static_cast<int32_t>(i);
  m->routed_counts_.assign(m->info_.moe_layers.size() * static_cast<size_t>(c.n_routed_experts), 0);
  const DType kv_dtype = gqa_kv_dtype(options.kv_cache, options.compute);
  m->kv_layout_ = gqa_kv_layout(cache_layers, c.num_key_value_heads, c.head_dim, kv_dtype);
  return m;
}

const Glm4LayerWeights& Glm4MoeModel::layer_weights(int64_t cache_layer) const {
  const int64_t l = config_.num_hidden_layers;
  return cache_layer < l ? weights_.layers[static_cast<size_t>(cache_layer)]
                         : weights_.mtp[static_cast<size_t>(cache_layer - l)].layer;
}

const MoeWeights* Glm4MoeModel::moe_weights(int64_t layer) const {
  if (layer < 0 || layer >= config_.num_hidden_layers + config_.num_nextn_predict_layers)
    return nullptr;
  const auto& moe = layer_weights(layer).moe;
  return moe ? &*moe : nullptr;
}

void Glm4MoeModel::norm_rows(const float* x, std::span<const float> weight, int64_t n, float* out) {
  const int64_t d = config_.hidden_size;
  pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      kernels::rmsnorm(x + t * d, weight.data(), d, config_.rms_norm_eps, out + t * d);
  });
}

void Glm4MoeModel::embed_rows(const MatrixRef& table, std::span<const int32_t> ids,
                              float* out) const {
  const int64_t d = config_.hidden_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    float* row = out + static_cast<int64_t>(i) * d;
    if (table.dtype == DType::kBF16) {
      const uint16_t* src = static_cast<const uint16_t*>(table.data) + ids[i] * d;
      for (int64_t j = 0; j < d; ++j) row[j] = bf16_to_f32(src[j]);
    } else {
      std::memcpy(row, static_cast<const float*>(table.data) + ids[i] * d, sizeof(float) * d);
    }
  }
}

void Glm4MoeModel::run_mlp(const MlpWeights& w, const float* xn, int64_t n, float* out) {
  const int64_t d = config_.hidden_size, width = w.gate_proj.rows;
  float* gate = grow(s_gate_, n * width);
  float* up = grow(s_up_, n * width);
  const kernels::LinearOutput gate_up[] = {{&w.gate_proj, gate, width}, {&w.up_proj, up, width}};
  linear_->group(xn, n, d, gate_up);
  pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    kernels::silu_mul(gate + t0 * width, up + t0 * width, (t1 - t0) * width, gate + t0 * width);
  });
  (*linear_)(gate, n, width, w.down_proj, out, d);
}

Status Glm4MoeModel::run_moe(const MoeWeights& w, int64_t layer, const float* xn, float* out) {
  const int64_t n = step_.n(), d = config_.hidden_size, e = config_.n_routed_experts;
  const int64_t k = config_.num_experts_per_tok;
  // Router in fp32 in every compute mode: routing decisions must not move with the fast mode.
  float* logits = grow(s_router_, n * e);
  kernels::linear_f32(xn, n, d, w.router, logits, e, *pool_);
  int32_t* ids = grow(s_ids_, n * k);
  float* weights = grow(s_weights_, n * k);
  const GatingParams& gp = info_.gating;
  float* scratch_all = grow(s_gating_, 2 * e * pool_->num_threads());
  pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int thread) {
    float* scratch = scratch_all + 2 * e * thread;
    for (int64_t t = t0; t < t1; ++t) {
      route_token(gp, logits + t * e, w.score_bias.data(), ids + t * k, weights + t * k, scratch);
      // transformers normalises a single expert's weight too (to 1, then scaled);
      // route_token leaves top-1 unnormalised, as DeepSeek's gate does.
      if (k == 1 && gp.norm_topk_prob) weights[t] = static_cast<float>(gp.routed_scaling_factor);
    }
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
  XDS_RETURN_IF_ERROR(exchange_->run(in));
  if (!w.shared) {
    std::memcpy(out, routed, sizeof(float) * static_cast<size_t>(n * d));
    return {};
  }
  run_mlp(*w.shared, xn, n, out);  // the shared experts, then + the routed sum
  for (int64_t i = 0; i < n * d; ++i) out[i] += routed[i];
  return {};
}

Status Glm4MoeModel::run_layer(int64_t layer, KvStorage& kv, float* x) {
  const Glm4LayerWeights& w = layer_weights(layer);
  const int64_t n = step_.n(), d = config_.hidden_size;
  float* xn = grow(s_xn_, n * d);
  float* tmp = grow(s_tmp_, n * d);
  norm_rows(x, w.input_norm, n, xn);
  run_attention(w.attn, layer, kv, xn, tmp);
  for (int64_t i = 0; i < n * d; ++i) x[i] += tmp[i];
  norm_rows(x, w.post_attn_norm, n, xn);
  if (w.dense) {
    run_mlp(*w.dense, xn, n, tmp);
  } else {
    XDS_RETURN_IF_ERROR(run_moe(*w.moe, layer, xn, tmp));
  }
  for (int64_t i = 0; i < n * d; ++i) x[i] += tmp[i];
  return {};
}

Status Glm4MoeModel::run_empty_layers(int64_t first, int64_t last) {
  for (int64_t l = first; l < last; ++l) {
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

Status Glm4MoeModel::forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) {
  const int64_t d = config_.hidden_size;
  XDS_RETURN_IF_ERROR(
      check_gqa_storage(kv_layout_, kv, config_.num_key_value_heads, config_.head_dim));
  step_.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    XDS_RETURN_IF_ERROR(step_.append(i, chunks[i].start_pos, chunks[i].tokens, chunks[i].blocks, kv,
                                     config_.vocab_size));
  }
  out.logit_tokens.clear();
  const int64_t n = step_.n();
  if (n == 0) {  // every MoE layer still joins its exchange, with no rows
    out.logits.clear();
    out.hidden.clear();
    return run_empty_layers(0, config_.num_hidden_layers);
  }
  rope_->ensure(step_.max_end());
  float* x = grow(s_x_, n * d);
  for (size_t i = 0; i < chunks.size(); ++i)
    embed_rows(weights_.embed, chunks[i].tokens, x + step_.chunks()[i].begin * d);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    XDS_RETURN_IF_ERROR(run_layer(l, kv, x));
    after_layer(l);
  }
  out.hidden.resize(static_cast<size_t>(n * d));
  norm_rows(x, weights_.final_norm, n, out.hidden.data());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const GqaChunk& ch = step_.chunks()[i];
    if (ch.count == 0) continue;
    for (int64_t t = chunks[i].all_logits ? 0 : ch.count - 1; t < ch.count; ++t)
      out.logit_tokens.push_back(ch.begin + t);
  }
  const int64_t rows = static_cast<int64_t>(out.logit_tokens.size());
  float* hn = grow(s_xn_, rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(hn + r * d, out.hidden.data() + out.logit_tokens[r] * d, sizeof(float) * d);
  }
  const int64_t v = config_.vocab_size;
  out.logits.resize(static_cast<size_t>(rows * v));
  (*linear_)(hn, rows, d, weights_.lm_head, out.logits.data(), v);
  return {};
}

// vLLM's glm4_moe_mtp: x = eh_proj([enorm(embed(next)); hnorm(hidden)]) with the embedding of
// a row at position 0 zeroed, then the MTP layer's decoder block at the hidden's position,
// logits = shared_head.head(shared_head.norm(x)).
Status Glm4MoeModel::forward_mtp(int64_t k, std::span<const MtpChunk> chunks, KvStorage& kv,
                                 StepOutput& out) {
  if (k < 0 || k >= config_.num_nextn_predict_layers) {
    return invalid_argument("MTP layer {} requested, the model has {}", k,
                            config_.num_nextn_predict_layers);
  }
  const Glm4MtpWeights& w = weights_.mtp[static_cast<size_t>(k)];
  const int64_t d = config_.hidden_size, layer = config_.num_hidden_layers + k;
  XDS_RETURN_IF_ERROR(
      check_gqa_storage(kv_layout_, kv, config_.num_key_value_heads, config_.head_dim));
  step_.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const MtpChunk& ch = chunks[i];
    XDS_RETURN_IF_ERROR(
        step_.append(i, ch.start_pos, ch.next_tokens, ch.blocks, kv, config_.vocab_size));
    if (!ch.next_tokens.empty() && ch.hidden == nullptr) {
      return invalid_argument("MTP chunk {}: {} rows without a hidden state", i,
                              ch.next_tokens.size());
    }
  }
  out.logit_tokens.clear();
  const int64_t n = step_.n();
  if (n == 0) {
    out.logits.clear();
    out.hidden.clear();
    return run_empty_layers(layer, layer + 1);
  }
  rope_->ensure(step_.max_end());
  float* cat = grow(s_cat_, n * 2 * d);  // [n, 2D] = [enorm(embed(next)); hnorm(hidden)]
  float* e = grow(s_tmp_, n * d);
  const double eps = config_.rms_norm_eps;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const MtpChunk& ch = chunks[i];
    const int64_t begin = step_.chunks()[i].begin;
    embed_rows(w.embed, ch.next_tokens, e + begin * d);
    for (int64_t r = 0; r < static_cast<int64_t>(ch.next_tokens.size()); ++r) {
      float* row = e + (begin + r) * d;
      if (ch.start_pos + r == 0) std::fill(row, row + d, 0.0f);
      kernels::rmsnorm(row, w.enorm.data(), d, eps, cat + (begin + r) * 2 * d);
      kernels::rmsnorm(ch.hidden + r * d, w.hnorm.data(), d, eps, cat + (begin + r) * 2 * d + d);
    }
  }
  float* x = grow(s_x_, n * d);
  (*linear_)(cat, n, 2 * d, w.eh_proj, x, d);
  XDS_RETURN_IF_ERROR(run_layer(layer, kv, x));
  after_layer(layer);
  // The residual output before shared_head.norm: the input hidden of a chained draft. The
  // chunks' hidden rows were consumed into `cat` above, so they may point into out.hidden.
  out.hidden.assign(x, x + n * d);
  float* hn = grow(s_xn_, n * d);
  norm_rows(x, w.head_norm, n, hn);
  out.logit_tokens.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) out.logit_tokens[static_cast<size_t>(t)] = t;
  const int64_t v = config_.vocab_size;
  out.logits.resize(static_cast<size_t>(n * v));
  (*linear_)(hn, n, d, w.head, out.logits.data(), v);
  return {};
}

}  // namespace xds

#include "model/qwen3_moe/qwen3_moe.h"

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

ModelInfo make_info(const std::string& dir, const Qwen3MoeConfig& c) {
  ModelInfo info;
  info.model_type = "qwen3_moe";
  info.name = config_json::checkpoint_name(dir);
  info.vocab_size = c.vocab_size;
  info.hidden_size = c.hidden_size;
  info.num_layers = c.num_hidden_layers;
  info.n_mtp_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_moe_layer(l)) info.moe_layers.push_back(l);
  }
  if (!info.moe_layers.empty()) {
    info.n_routed_experts = c.num_experts;
    info.experts_per_token = c.num_experts_per_tok;
    info.gating = gating_params(c);
    info.expert_intermediate_size = c.moe_intermediate_size;
  }
  info.max_position_embeddings = c.max_position_embeddings;
  info.eos_token_ids = c.eos_token_ids;
  info.bos_token_id = c.bos_token_id;
  return info;
}

// The options this family does not run yet, each refused in one line.
Status check_options(const ModelOptions& o) {
  if (o.attention != AttentionMode::kAuto) {
    return invalid_argument(
        "Qwen3-MoE: --attention absorbed/expanded are MLA modes; this model has GQA attention "
        "(leave it auto)");
  }
  if (o.activation == ActivationDType::kInt8) {
    return unimplemented(
        "Qwen3-MoE: --activation-dtype int8 needs integer weights, which this family does not "
        "load yet");
  }
  return {};
}

}  // namespace

Qwen3MoeModel::~Qwen3MoeModel() = default;

Result<ModelInfo> Qwen3MoeModel::load_info(const std::string& dir) {
  XDS_ASSIGN_OR_RETURN(const Qwen3MoeConfig config, load_qwen3_moe_config(dir));
  return make_info(dir, config);
}

Result<std::unique_ptr<Qwen3MoeModel>> Qwen3MoeModel::load(const std::string& dir,
                                                           const ModelOptions& options) {
  XDS_RETURN_IF_ERROR(check_options(options));
  std::unique_ptr<Qwen3MoeModel> m(new Qwen3MoeModel());
  XDS_ASSIGN_OR_RETURN(m->config_, load_qwen3_moe_config(dir));
  const Qwen3MoeConfig& c = m->config_;
  m->options_ = options;
  XDS_ASSIGN_OR_RETURN(ModelRuntime rt, open_model_runtime(dir, options));
  m->pool_ = std::move(rt.pool);
  m->checkpoint_ = std::move(rt.checkpoint);
  m->store_ = std::move(rt.store);
  XDS_ASSIGN_OR_RETURN(m->weights_, bind_qwen3_moe_weights(c, *m->checkpoint_, *m->store_));
  m->store_->finish_progress();
  m->rope_ = std::make_unique<RopeTable>(rope_params(c));
  m->linear_ = std::make_unique<LinearRunner>(options.compute, *m->pool_);
  std::vector<const MoeWeights*> moe_layers;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers.push_back(m->moe_weights(l));
  m->local_exchange_ = make_owned_local_moe(std::move(moe_layers), c.hidden_size,
                                          options.compute, *m->pool_);
  m->exchange_ = m->local_exchange_.get();
  m->info_ = make_info(dir, c);
  m->moe_row_.assign(static_cast<size_t>(c.num_hidden_layers), -1);
  for (size_t i = 0; i < m->info_.moe_layers.size(); ++i)
    m->moe_row_[static_cast<size_t>(m->info_.moe_layers[i])] = static_cast<int32_t>(i);
  m->routed_counts_.assign(m->info_.moe_layers.size() * static_cast<size_t>(c.num_experts), 0);
  const DType kv_dtype = gqa_kv_dtype(options.kv_cache, options.compute);
  m->kv_layout_ = gqa_kv_layout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, kv_dtype);
  return m;
}

const MoeWeights* Qwen3MoeModel::moe_weights(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(weights_.layers.size())) return nullptr;
  const auto& moe = weights_.layers[static_cast<size_t>(layer)].moe;
  return moe ? &*moe : nullptr;
}

void Qwen3MoeModel::norm_rows(const float* x, std::span<const float> weight, int64_t n,
                              float* out) {
  const int64_t d = config_.hidden_size;
  pool_->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      kernels::rmsnorm(x + t * d, weight.data(), d, config_.rms_norm_eps, out + t * d);
  });
}

void Qwen3MoeModel::run_mlp(const MlpWeights& w, const float* xn, int64_t n, float* out) {
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

Status Qwen3MoeModel::run_moe(const MoeWeights& w, int64_t layer, const float* xn, float* out) {
  const int64_t n = step_.n(), d = config_.hidden_size, e = config_.num_experts;
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
      route_token(gp, logits + t * e, nullptr, ids + t * k, weights + t * k, scratch);
      // transformers normalises a single expert's weight too (to 1); route_token leaves
      // top-1 unnormalised, as DeepSeek's gate does.
      if (k == 1 && gp.norm_topk_prob) weights[t] = 1.0f;
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
  MoeExchangeInput in{layer, xn, n, ids, weights, k, out};
  return exchange_->run(in);
}

Status Qwen3MoeModel::run_layer(int64_t layer, KvStorage& kv, float* x) {
  const Qwen3MoeLayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const int64_t n = step_.n(), d = config_.hidden_size;
  float* xn = grow(s_xn_, n * d);
  float* tmp = grow(s_tmp_, n * d);
  norm_rows(x, w.input_norm, n, xn);
  run_attention(layer, kv, xn, tmp);
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

Status Qwen3MoeModel::forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) {
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
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
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
  rope_->ensure(step_.max_end());
  float* x = grow(s_x_, n * d);
  const MatrixRef& table = weights_.embed;
  for (int64_t t = 0, at = 0; t < static_cast<int64_t>(chunks.size()); ++t) {
    for (const int32_t id : chunks[t].tokens) {
      float* row = x + at++ * d;
      if (table.dtype == DType::kBF16) {
        const uint16_t* src = static_cast<const uint16_t*>(table.data) + id * d;
        for (int64_t i = 0; i < d; ++i) row[i] = bf16_to_f32(src[i]);
      } else {
        std::memcpy(row, static_cast<const float*>(table.data) + id * d, sizeof(float) * d);
      }
    }
  }
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

Status Qwen3MoeModel::forward_mtp(int64_t k, std::span<const MtpChunk>, KvStorage&, StepOutput&) {
  return invalid_argument("MTP layer {} requested: Qwen3-MoE has no MTP layers", k);
}

}  // namespace xds

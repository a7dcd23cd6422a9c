#include "model/deepseek_v3/deepseek_v3_weights.h"

#include <fmt/format.h>

#include "model/int4_weights.h"
#include "model/int8_weights.h"
#include "model/safetensors.h"
#include "model/routed_experts_binding.h"
#include "model/weights.h"

namespace xds {
namespace {

// Binds the tensors of one model; `ckpt`, `store` and the block sizes stay fixed.
class Binder {
 public:
  Binder(const DeepseekV3Config& c, const Checkpoint& ckpt, RepackCache& store)
      : c_(c), ckpt_(ckpt), store_(store) {
    if (c.fp8) {
      br_ = c.fp8->block_rows;
      bc_ = c.fp8->block_cols;
    }
  }

  Result<MatrixRef> matrix(const std::string& name, int64_t rows, int64_t cols) {
    return bind_matrix(ckpt_, name, rows, cols, store_, br_, bc_);
  }
  // A weight used only as y = x · Wᵀ: panels when BF16 (bind_linear).
  // Integer checkpoints: int8 (W8A8) or int4 (W4A16, W4A8) panels where quantization_config
  // quantizes the module (int4_weights.h), the module's float dtype where it is ignored.
  Result<MatrixRef> linear(const std::string& name, int64_t rows, int64_t cols) {
    if (c_.int_quant) return bind_int_linear(ckpt_, *c_.int_quant, name, rows, cols, store_);
    return bind_linear(ckpt_, name, rows, cols, store_, br_, bc_);
  }
  // kv_b_proj, which attention slices by heads: a quantized one is dequantized to F32 rows.
  Result<MatrixRef> sliced_linear(const std::string& name, int64_t rows, int64_t cols) {
    if (c_.int_quant) {
      XDS_ASSIGN_OR_RETURN(const bool quantized, int_quantized(ckpt_, *c_.int_quant, name));
      if (quantized) return bind_int_as_f32_rows(ckpt_, *c_.int_quant, name, rows, cols, store_);
    }
    return matrix(name, rows, cols);
  }
  // Whether `kv_b_name` is an int8 kv_b_proj: of a W8A8 checkpoint, or of the int8 group of
  // a mixed-precision 4-bit one (its config quantizes it: not in `ignore`; the tensor must
  // then be I8, int8_weights.h).
  Result<bool> int8_kv_b(const std::string& kv_b_name) {
    if (!c_.int_quant) return false;
    const std::string module = kv_b_name.substr(0, kv_b_name.size() - std::string(".weight").size());
    if (c_.int_quant->scheme_of(module) != IntScheme::kW8A8) return false;
    return w8a8_quantized(ckpt_, *c_.int_quant, kv_b_name);
  }
  // The embedding table as the tied lm_head: never quantized (not a Linear module).
  Result<MatrixRef> embedding_linear(const std::string& name, int64_t rows, int64_t cols) {
    return bind_linear(ckpt_, name, rows, cols, store_, br_, bc_);
  }
  Result<std::span<const float>> vec(const std::string& name, int64_t n) {
    return bind_vector_f32(ckpt_, name, n, store_);
  }
  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }

  Result<MlpWeights> mlp(const std::string& p, int64_t width) {
    const int64_t d = c_.hidden_size;
    MlpWeights m;
    XDS_ASSIGN_OR_RETURN(m.gate_proj, linear(p + ".gate_proj.weight", width, d));
    XDS_ASSIGN_OR_RETURN(m.up_proj, linear(p + ".up_proj.weight", width, d));
    XDS_ASSIGN_OR_RETURN(m.down_proj, linear(p + ".down_proj.weight", d, width));
    return m;
  }

  Result<LayerWeights> layer(int64_t i) {
    const std::string p = fmt::format("model.layers.{}", i);
    const int64_t d = c_.hidden_size, h = c_.num_attention_heads;
    LayerWeights l;
    XDS_ASSIGN_OR_RETURN(l.input_norm, vec(p + ".input_layernorm.weight", d));
    XDS_ASSIGN_OR_RETURN(l.post_attn_norm, vec(p + ".post_attention_layernorm.weight", d));
    const std::string a = p + ".self_attn";
    if (c_.q_lora_rank) {
      const int64_t q = *c_.q_lora_rank;
      XDS_ASSIGN_OR_RETURN(l.attn.q_a_proj, linear(a + ".q_a_proj.weight", q, d));
      XDS_ASSIGN_OR_RETURN(l.attn.q_a_norm, vec(a + ".q_a_layernorm.weight", q));
      XDS_ASSIGN_OR_RETURN(l.attn.q_b_proj,
                           linear(a + ".q_b_proj.weight", h * c_.qk_head_dim(), q));
    } else {
      XDS_ASSIGN_OR_RETURN(l.attn.q_proj, linear(a + ".q_proj.weight", h * c_.qk_head_dim(), d));
    }
    XDS_ASSIGN_OR_RETURN(l.attn.kv_a_proj, linear(a + ".kv_a_proj_with_mqa.weight",
                                                  c_.kv_lora_rank + c_.qk_rope_head_dim, d));
    XDS_ASSIGN_OR_RETURN(l.attn.kv_a_norm, vec(a + ".kv_a_layernorm.weight", c_.kv_lora_rank));
    const int64_t kv_b_rows = h * (c_.qk_nope_head_dim + c_.v_head_dim);
    XDS_ASSIGN_OR_RETURN(const bool kv_b_int8, int8_kv_b(a + ".kv_b_proj.weight"));
    if (kv_b_int8) {
      // int8 kv_b_proj: int8 panels whole (the prefill's expansion) and per head (decode).
      XDS_ASSIGN_OR_RETURN(l.attn.kv_b_proj,
                           linear(a + ".kv_b_proj.weight", kv_b_rows, c_.kv_lora_rank));
      XDS_ASSIGN_OR_RETURN(AbsorbedHeads heads,
                           bind_int8_absorbed_heads(ckpt_, a + ".kv_b_proj", h, c_.qk_nope_head_dim,
                                                    c_.v_head_dim, c_.kv_lora_rank, store_));
      l.attn.uk_t = std::move(heads.uk_t);
      l.attn.uv = std::move(heads.uv);
      l.attn.uk_scale = heads.uk_scale;
      return attention_tail(i, p, std::move(l));
    }
    XDS_ASSIGN_OR_RETURN(l.attn.kv_b_proj,
                         sliced_linear(a + ".kv_b_proj.weight", kv_b_rows, c_.kv_lora_rank));
    // A 4-bit kv_b_proj has no `.weight` (its F32 rows serve both paths): no head panels.
    AbsorbedHeads heads;
    if (has(a + ".kv_b_proj.weight")) {
      XDS_ASSIGN_OR_RETURN(heads,
                           bind_absorbed_heads(ckpt_, a + ".kv_b_proj.weight", l.attn.kv_b_proj, h,
                                               c_.qk_nope_head_dim, c_.v_head_dim, store_));
    }
    l.attn.uk_t = std::move(heads.uk_t);
    l.attn.uv = std::move(heads.uv);
    if (!l.attn.uv.empty()) {
      // The heads have their own panels; kv_b_proj is then only the prefill's expansion, a
      // product of every context row: as panels too (far cheaper than widening it to fp32
      // for sgemm).
      XDS_ASSIGN_OR_RETURN(l.attn.kv_b_proj,
                           linear(a + ".kv_b_proj.weight", kv_b_rows, c_.kv_lora_rank));
    }
    return attention_tail(i, p, std::move(l));
  }

  // o_proj and the layer's MLP or MoE, after the attention's projections.
  Result<LayerWeights> attention_tail(int64_t i, const std::string& p, LayerWeights l) {
    const int64_t d = c_.hidden_size, h = c_.num_attention_heads;
    const std::string a = p + ".self_attn";
    XDS_ASSIGN_OR_RETURN(l.attn.o_proj, linear(a + ".o_proj.weight", d, h * c_.v_head_dim));
    if (!c_.is_moe_layer(i)) {
      XDS_ASSIGN_OR_RETURN(l.dense, mlp(p + ".mlp", c_.intermediate_size));
      return l;
    }
    MoeWeights moe;
    XDS_ASSIGN_OR_RETURN(moe.router, linear(p + ".mlp.gate.weight", c_.n_routed_experts, d));
    const std::string bias = p + ".mlp.gate.e_score_correction_bias";
    if (c_.topk_method == TopkMethod::kNoauxTc) {
      XDS_ASSIGN_OR_RETURN(moe.score_bias, vec(bias, c_.n_routed_experts));
    }
    XDS_RETURN_IF_ERROR(bind_routed_experts(
        store_, p, c_.n_routed_experts,
        [&](const std::string& m) { return mlp(m, c_.moe_intermediate_size); }, moe.experts));
    if (c_.n_shared_experts > 0) {
      XDS_ASSIGN_OR_RETURN(moe.shared, mlp(p + ".mlp.shared_experts",
                                           c_.n_shared_experts * c_.moe_intermediate_size));
    }
    l.moe = std::move(moe);
    return l;
  }

 private:
  const DeepseekV3Config& c_;
  const Checkpoint& ckpt_;
  RepackCache& store_;
  int64_t br_ = 128, bc_ = 128;
};

}  // namespace

Result<DeepseekV3Weights> bind_deepseek_v3_weights(const DeepseekV3Config& c,
                                                   const Checkpoint& ckpt, RepackCache& store) {
  Binder b(c, ckpt, store);
  const int64_t d = c.hidden_size, v = c.vocab_size;
  DeepseekV3Weights w;
  XDS_ASSIGN_OR_RETURN(w.embed, b.matrix("model.embed_tokens.weight", v, d));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    XDS_ASSIGN_OR_RETURN(LayerWeights l, b.layer(i));
    w.layers.push_back(std::move(l));
  }
  XDS_ASSIGN_OR_RETURN(w.final_norm, b.vec("model.norm.weight", d));
  if (c.tie_word_embeddings && !b.has("lm_head.weight")) {
    XDS_ASSIGN_OR_RETURN(w.lm_head, b.embedding_linear("model.embed_tokens.weight", v, d));
  } else {
    XDS_ASSIGN_OR_RETURN(w.lm_head, b.linear("lm_head.weight", v, d));
  }
  for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    const int64_t i = c.num_hidden_layers + k;
    const std::string p = fmt::format("model.layers.{}", i);
    MtpWeights m;
    if (b.has(p + ".embed_tokens.weight")) {
      XDS_ASSIGN_OR_RETURN(m.embed, b.matrix(p + ".embed_tokens.weight", v, d));
    } else {
      m.embed = w.embed;
    }
    XDS_ASSIGN_OR_RETURN(m.enorm, b.vec(p + ".enorm.weight", d));
    XDS_ASSIGN_OR_RETURN(m.hnorm, b.vec(p + ".hnorm.weight", d));
    XDS_ASSIGN_OR_RETURN(m.eh_proj, b.linear(p + ".eh_proj.weight", d, 2 * d));
    XDS_ASSIGN_OR_RETURN(m.head_norm, b.vec(p + ".shared_head.norm.weight", d));
    if (b.has(p + ".shared_head.head.weight")) {
      XDS_ASSIGN_OR_RETURN(m.head, b.linear(p + ".shared_head.head.weight", v, d));
    } else {
      m.head = w.lm_head;
    }
    XDS_ASSIGN_OR_RETURN(m.layer, b.layer(i));
    w.mtp.push_back(std::move(m));
  }
  return w;
}

}  // namespace xds

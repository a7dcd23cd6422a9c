#include "model/glm4_moe/glm4_moe_weights.h"

#include <fmt/format.h>

#include "model/safetensors.h"
#include "model/routed_experts_binding.h"
#include "model/weights.h"

namespace xds {
namespace {

class Binder {
 public:
  Binder(const Glm4MoeConfig& c, const Checkpoint& ckpt, RepackCache& store)
      : c_(c), ckpt_(ckpt), store_(store) {}

  // A weight used only as y = x · Wᵀ: panels when BF16/F16 (bind_linear).
  Result<MatrixRef> linear(const std::string& name, int64_t rows, int64_t cols) {
    return bind_linear(ckpt_, name, rows, cols, store_);
  }
  Result<MatrixRef> matrix(const std::string& name, int64_t rows, int64_t cols) {
    return bind_matrix(ckpt_, name, rows, cols, store_);
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

  Result<Glm4AttentionWeights> attention(const std::string& a) {
    const int64_t d = c_.hidden_size, dh = c_.head_dim;
    const int64_t q_rows = c_.num_attention_heads * dh, kv_rows = c_.num_key_value_heads * dh;
    Glm4AttentionWeights w;
    XDS_ASSIGN_OR_RETURN(w.q_proj, linear(a + ".q_proj.weight", q_rows, d));
    XDS_ASSIGN_OR_RETURN(w.k_proj, linear(a + ".k_proj.weight", kv_rows, d));
    XDS_ASSIGN_OR_RETURN(w.v_proj, linear(a + ".v_proj.weight", kv_rows, d));
    XDS_ASSIGN_OR_RETURN(w.o_proj, linear(a + ".o_proj.weight", d, q_rows));
    if (c_.attention_bias) {
      XDS_ASSIGN_OR_RETURN(w.q_bias, vec(a + ".q_proj.bias", q_rows));
      XDS_ASSIGN_OR_RETURN(w.k_bias, vec(a + ".k_proj.bias", kv_rows));
      XDS_ASSIGN_OR_RETURN(w.v_bias, vec(a + ".v_proj.bias", kv_rows));
    }
    if (c_.use_qk_norm) {
      XDS_ASSIGN_OR_RETURN(w.q_norm, vec(a + ".q_norm.weight", dh));
      XDS_ASSIGN_OR_RETURN(w.k_norm, vec(a + ".k_norm.weight", dh));
    }
    return w;
  }

  // Decoder layer `i` (an MTP layer's block too: always MoE there, i >= first_k_dense).
  Result<Glm4LayerWeights> layer(int64_t i) {
    const std::string p = fmt::format("model.layers.{}", i);
    const int64_t d = c_.hidden_size;
    Glm4LayerWeights l;
    XDS_ASSIGN_OR_RETURN(l.input_norm, vec(p + ".input_layernorm.weight", d));
    XDS_ASSIGN_OR_RETURN(l.post_attn_norm, vec(p + ".post_attention_layernorm.weight", d));
    XDS_ASSIGN_OR_RETURN(l.attn, attention(p + ".self_attn"));
    if (!c_.is_moe_layer(i)) {
      XDS_ASSIGN_OR_RETURN(l.dense, mlp(p + ".mlp", c_.intermediate_size));
      return l;
    }
    const int64_t e = c_.n_routed_experts;
    MoeWeights moe;
    XDS_ASSIGN_OR_RETURN(moe.router, linear(p + ".mlp.gate.weight", e, d));
    XDS_ASSIGN_OR_RETURN(moe.score_bias, vec(p + ".mlp.gate.e_score_correction_bias", e));
    XDS_RETURN_IF_ERROR(bind_routed_experts(
        store_, p, e, [&](const std::string& m) { return mlp(m, c_.moe_intermediate_size); },
        moe.experts));
    if (c_.n_shared_experts > 0) {
      XDS_ASSIGN_OR_RETURN(moe.shared, mlp(p + ".mlp.shared_experts",
                                           c_.n_shared_experts * c_.moe_intermediate_size));
    }
    l.moe = std::move(moe);
    return l;
  }

  Result<Glm4MtpWeights> mtp(int64_t k, const Glm4MoeWeights& w) {
    const int64_t d = c_.hidden_size, v = c_.vocab_size;
    const std::string p = fmt::format("model.layers.{}", c_.num_hidden_layers + k);
    Glm4MtpWeights m;
    if (has(p + ".embed_tokens.weight")) {
      XDS_ASSIGN_OR_RETURN(m.embed, matrix(p + ".embed_tokens.weight", v, d));
    } else {
      m.embed = w.embed;
    }
    XDS_ASSIGN_OR_RETURN(m.enorm, vec(p + ".enorm.weight", d));
    XDS_ASSIGN_OR_RETURN(m.hnorm, vec(p + ".hnorm.weight", d));
    XDS_ASSIGN_OR_RETURN(m.eh_proj, linear(p + ".eh_proj.weight", d, 2 * d));
    XDS_ASSIGN_OR_RETURN(m.head_norm, vec(p + ".shared_head.norm.weight", d));
    if (has(p + ".shared_head.head.weight")) {
      XDS_ASSIGN_OR_RETURN(m.head, linear(p + ".shared_head.head.weight", v, d));
    } else {
      m.head = w.lm_head;
    }
    XDS_ASSIGN_OR_RETURN(m.layer, layer(c_.num_hidden_layers + k));
    return m;
  }

 private:
  const Glm4MoeConfig& c_;
  const Checkpoint& ckpt_;
  RepackCache& store_;
};

}  // namespace

Result<Glm4MoeWeights> bind_glm4_moe_weights(const Glm4MoeConfig& c, const Checkpoint& ckpt,
                                             RepackCache& store) {
  Binder b(c, ckpt, store);
  const int64_t d = c.hidden_size, v = c.vocab_size;
  Glm4MoeWeights w;
  XDS_ASSIGN_OR_RETURN(w.embed, bind_matrix(ckpt, "model.embed_tokens.weight", v, d, store));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    XDS_ASSIGN_OR_RETURN(Glm4LayerWeights l, b.layer(i));
    w.layers.push_back(std::move(l));
  }
  XDS_ASSIGN_OR_RETURN(w.final_norm, b.vec("model.norm.weight", d));
  // Tied: the embedding is the head (transformers ignores a stored lm_head.weight then).
  XDS_ASSIGN_OR_RETURN(
      w.lm_head,
      b.linear(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", v, d));
  for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    XDS_ASSIGN_OR_RETURN(Glm4MtpWeights m, b.mtp(k, w));
    w.mtp.push_back(std::move(m));
  }
  return w;
}

}  // namespace xds

#include "model/qwen3_moe/qwen3_moe_weights.h"

#include <fmt/format.h>

#include "model/safetensors.h"
#include "model/routed_experts_binding.h"
#include "model/weights.h"

namespace xds {
namespace {

class Binder {
 public:
  Binder(const Qwen3MoeConfig& c, const Checkpoint& ckpt, RepackCache& store)
      : c_(c), ckpt_(ckpt), store_(store) {}

  // A weight used only as y = x · Wᵀ: panels when BF16/F16 (bind_linear).
  Result<MatrixRef> linear(const std::string& name, int64_t rows, int64_t cols) {
    return bind_linear(ckpt_, name, rows, cols, store_);
  }
  Result<std::span<const float>> vec(const std::string& name, int64_t n) {
    return bind_vector_f32(ckpt_, name, n, store_);
  }

  Result<MlpWeights> mlp(const std::string& p, int64_t width) {
    const int64_t d = c_.hidden_size;
    MlpWeights m;
    XDS_ASSIGN_OR_RETURN(m.gate_proj, linear(p + ".gate_proj.weight", width, d));
    XDS_ASSIGN_OR_RETURN(m.up_proj, linear(p + ".up_proj.weight", width, d));
    XDS_ASSIGN_OR_RETURN(m.down_proj, linear(p + ".down_proj.weight", d, width));
    return m;
  }

  Result<Qwen3MoeLayerWeights> layer(int64_t i) {
    const std::string p = fmt::format("model.layers.{}", i);
    const int64_t d = c_.hidden_size, dh = c_.head_dim;
    const int64_t q_rows = c_.num_attention_heads * dh, kv_rows = c_.num_key_value_heads * dh;
    Qwen3MoeLayerWeights l;
    XDS_ASSIGN_OR_RETURN(l.input_norm, vec(p + ".input_layernorm.weight", d));
    XDS_ASSIGN_OR_RETURN(l.post_attn_norm, vec(p + ".post_attention_layernorm.weight", d));
    const std::string a = p + ".self_attn";
    XDS_ASSIGN_OR_RETURN(l.attn.q_proj, linear(a + ".q_proj.weight", q_rows, d));
    XDS_ASSIGN_OR_RETURN(l.attn.k_proj, linear(a + ".k_proj.weight", kv_rows, d));
    XDS_ASSIGN_OR_RETURN(l.attn.v_proj, linear(a + ".v_proj.weight", kv_rows, d));
    XDS_ASSIGN_OR_RETURN(l.attn.o_proj, linear(a + ".o_proj.weight", d, q_rows));
    XDS_ASSIGN_OR_RETURN(l.attn.q_norm, vec(a + ".q_norm.weight", dh));
    XDS_ASSIGN_OR_RETURN(l.attn.k_norm, vec(a + ".k_norm.weight", dh));
    if (!c_.is_moe_layer(i)) {
      XDS_ASSIGN_OR_RETURN(l.dense, mlp(p + ".mlp", c_.intermediate_size));
      return l;
    }
    MoeWeights moe;
    XDS_ASSIGN_OR_RETURN(moe.router, linear(p + ".mlp.gate.weight", c_.num_experts, d));
    XDS_RETURN_IF_ERROR(bind_routed_experts(
        store_, p, c_.num_experts,
        [&](const std::string& m) { return mlp(m, c_.moe_intermediate_size); }, moe.experts));
    l.moe = std::move(moe);
    return l;
  }

 private:
  const Qwen3MoeConfig& c_;
  const Checkpoint& ckpt_;
  RepackCache& store_;
};

}  // namespace

Result<Qwen3MoeWeights> bind_qwen3_moe_weights(const Qwen3MoeConfig& c, const Checkpoint& ckpt,
                                               RepackCache& store) {
  Binder b(c, ckpt, store);
  const int64_t d = c.hidden_size, v = c.vocab_size;
  Qwen3MoeWeights w;
  XDS_ASSIGN_OR_RETURN(w.embed, bind_matrix(ckpt, "model.embed_tokens.weight", v, d, store));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    XDS_ASSIGN_OR_RETURN(Qwen3MoeLayerWeights l, b.layer(i));
    w.layers.push_back(std::move(l));
  }
  XDS_ASSIGN_OR_RETURN(w.final_norm, b.vec("model.norm.weight", d));
  // Tied: the embedding is the head (transformers ignores a stored lm_head.weight then).
  XDS_ASSIGN_OR_RETURN(
      w.lm_head,
      b.linear(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", v, d));
  return w;
}

}  // namespace xds

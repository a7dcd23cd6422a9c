#include "mkmodel/glm4_checkpoint.h"

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/atomic_file.h"

namespace xds {
namespace {

using ojson = nlohmann::ordered_json;

// The keys and their order as zai-org/GLM-4.5's config.json has them.
ojson glm4_config_json(const Glm4MoeConfig& c, bool f16) {
  ojson j;
  j["architectures"] = {"Glm4MoeForCausalLM"};
  j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  j["pad_token_id"] = c.eos_token_ids.front();
  j["eos_token_id"] = c.eos_token_ids;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["partial_rotary_factor"] = c.partial_rotary_factor;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["model_type"] = "glm4_moe";
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_attention_heads"] = c.num_attention_heads;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_scaling"] = nullptr;
  j["rope_theta"] = c.rope_theta;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = f16 ? "float16" : "bfloat16";
  j["transformers_version"] = "4.54.0";
  j["use_cache"] = true;
  j["use_qk_norm"] = c.use_qk_norm;
  j["vocab_size"] = c.vocab_size;
  return j;
}

class TensorList {
 public:
  explicit TensorList(const Glm4MoeConfig& c) : c_(c) {}

  void mlp(const std::string& p, int64_t width) {
    const int64_t d = c_.hidden_size;
    add(p + ".gate_proj.weight", {width, d}, RandomInit::kLinear);
    add(p + ".up_proj.weight", {width, d}, RandomInit::kLinear);
    add(p + ".down_proj.weight", {d, width}, RandomInit::kLinear);
  }

  void decoder_layer(int64_t l) {
    const int64_t d = c_.hidden_size, dh = c_.head_dim;
    const int64_t q_rows = c_.num_attention_heads * dh, kv_rows = c_.num_key_value_heads * dh;
    const std::string p = "model.layers." + std::to_string(l);
    const std::string a = p + ".self_attn";
    add(p + ".input_layernorm.weight", {d}, RandomInit::kNorm);
    add(a + ".q_proj.weight", {q_rows, d}, RandomInit::kLinear);
    add(a + ".k_proj.weight", {kv_rows, d}, RandomInit::kLinear);
    add(a + ".v_proj.weight", {kv_rows, d}, RandomInit::kLinear);
    if (c_.attention_bias) {
      add(a + ".q_proj.bias", {q_rows}, RandomInit::kBias);
      add(a + ".k_proj.bias", {kv_rows}, RandomInit::kBias);
      add(a + ".v_proj.bias", {kv_rows}, RandomInit::kBias);
    }
    add(a + ".o_proj.weight", {d, q_rows}, RandomInit::kLinear);
    if (c_.use_qk_norm) {
      add(a + ".q_norm.weight", {dh}, RandomInit::kNorm);
      add(a + ".k_norm.weight", {dh}, RandomInit::kNorm);
    }
    add(p + ".post_attention_layernorm.weight", {d}, RandomInit::kNorm);
    if (!c_.is_moe_layer(l)) {
      mlp(p + ".mlp", c_.intermediate_size);
      return;
    }
    add(p + ".mlp.gate.weight", {c_.n_routed_experts, d}, RandomInit::kRouter);
    tensors_.push_back({p + ".mlp.gate.e_score_correction_bias",
                        {c_.n_routed_experts},
                        RandomInit::kBias,
                        /*f32=*/true});
    for (int64_t e = 0; e < c_.n_routed_experts; ++e)
      mlp(p + ".mlp.experts." + std::to_string(e), c_.moe_intermediate_size);
    if (c_.n_shared_experts > 0)
      mlp(p + ".mlp.shared_experts", c_.n_shared_experts * c_.moe_intermediate_size);
  }

  // MTP layer at index l = num_hidden_layers + k: its own norms, eh_proj and shared head, and
  // a whole decoder layer (the embedding is the model's, as GLM-4.5 publishes it).
  void mtp_layer(int64_t l) {
    const int64_t d = c_.hidden_size;
    const std::string p = "model.layers." + std::to_string(l);
    add(p + ".enorm.weight", {d}, RandomInit::kNorm);
    add(p + ".hnorm.weight", {d}, RandomInit::kNorm);
    add(p + ".eh_proj.weight", {d, 2 * d}, RandomInit::kLinear);
    add(p + ".shared_head.norm.weight", {d}, RandomInit::kNorm);
    add(p + ".shared_head.head.weight", {c_.vocab_size, d}, RandomInit::kLinear);
    decoder_layer(l);
  }

  std::vector<RandomTensor> all() {
    const int64_t d = c_.hidden_size, v = c_.vocab_size;
    add("model.embed_tokens.weight", {v, d}, RandomInit::kEmbed);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) decoder_layer(l);
    for (int64_t k = 0; k < c_.num_nextn_predict_layers; ++k) mtp_layer(c_.num_hidden_layers + k);
    add("model.norm.weight", {d}, RandomInit::kNorm);
    if (!c_.tie_word_embeddings) add("lm_head.weight", {v, d}, RandomInit::kLinear);
    return std::move(tensors_);
  }

 private:
  void add(const std::string& name, std::vector<int64_t> shape, RandomInit init) {
    tensors_.push_back({name, std::move(shape), init, false});
  }
  const Glm4MoeConfig& c_;
  std::vector<RandomTensor> tensors_;
};

Status write_text(const std::string& path, const std::string& text) {
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(text));
  return f.commit();
}

}  // namespace

Result<Glm4MoeConfig> glm4_mkmodel_config(const MkModelOptions& o) {
  if (o.weights_int8 || !o.weights_int4.empty() || !o.from_dir.empty() || !o.router_skew.empty() ||
      o.yarn) {
    return unimplemented(
        "mkmodel --arch glm4_moe: --weights-int8, --weights-int4, --from, --router-skew and "
        "--yarn are not supported for GLM-4.5 yet");
  }
  if (o.dtype != "bf16" && o.dtype != "f16") {
    return invalid_argument("mkmodel --arch glm4_moe: --dtype must be bf16 or f16, got '{}'",
                            o.dtype);
  }
  if (o.preset != "tiny") {
    return invalid_argument("mkmodel --arch glm4_moe: --preset must be tiny, got '{}'", o.preset);
  }
  Glm4MoeConfig c;
  c.eos_token_ids = {1};
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.partial_rotary_factor = o.partial_rotary_factor.value_or(0.5);
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.first_k_dense_replace = 1;
  c.n_group = 2;
  c.topk_group = 1;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e6;
  c.max_position_embeddings = o.max_position_embeddings.value_or(512);
  c.attention_bias = o.attention_bias;
  c.use_qk_norm = o.qk_norm;
  c.num_nextn_predict_layers = o.mtp_layers.value_or(1);
  if (c.num_nextn_predict_layers < 0) {
    return invalid_argument("mkmodel: mtp layers must be >= 0, got {}", c.num_nextn_predict_layers);
  }
  return c;
}

Status write_glm4_checkpoint(const MkModelOptions& o) {
  XDS_ASSIGN_OR_RETURN(const Glm4MoeConfig c, glm4_mkmodel_config(o));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return internal_error("{}: cannot create the directory: {}", o.out_dir, ec.message());
  const bool f16 = o.dtype == "f16";
  const std::string config_text = glm4_config_json(c, f16).dump(2) + "\n";
  // The config must read back as the same model (guards the key names and the options).
  XDS_RETURN_IF_ERROR(parse_glm4_moe_config(config_text, o.out_dir + "/config.json").status());
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/config.json", config_text));
  const ojson gen = {{"_from_model_config", true},
                     {"eos_token_id", c.eos_token_ids},
                     {"pad_token_id", c.eos_token_ids.front()},
                     {"transformers_version", "4.54.0"}};
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/generation_config.json", gen.dump(2) + "\n"));
  return write_random_tensors(o, TensorList(c).all(), f16 ? DType::kF16 : DType::kBF16);
}

}  // namespace xds

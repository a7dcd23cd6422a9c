#include "mkmodel/qwen3_checkpoint.h"

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/atomic_file.h"

namespace xds {
namespace {

using ojson = nlohmann::ordered_json;

ojson qwen3_config_json(const Qwen3MoeConfig& c, bool f16) {
  ojson j;
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id ? ojson(*c.bos_token_id) : ojson(nullptr);
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["eos_token_id"] = c.eos_token_ids.empty() ? ojson(nullptr) : ojson(c.eos_token_ids[0]);
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["max_window_layers"] = c.num_hidden_layers;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["model_type"] = "qwen3_moe";
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["output_router_logits"] = false;
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (c.rope_scaling) {
    j["rope_scaling"] = {
        {"factor", c.rope_scaling->factor},
        {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings},
        {"rope_type", "yarn"}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_theta"] = c.rope_theta;
  j["router_aux_loss_coef"] = 0.001;
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = f16 ? "float16" : "bfloat16";
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  j["vocab_size"] = c.vocab_size;
  return j;
}

std::vector<RandomTensor> qwen3_tensors(const Qwen3MoeConfig& c) {
  const int64_t d = c.hidden_size, dh = c.head_dim, v = c.vocab_size;
  const int64_t q_rows = c.num_attention_heads * dh, kv_rows = c.num_key_value_heads * dh;
  std::vector<RandomTensor> t;
  auto mlp = [&](const std::string& p, int64_t width) {
    t.push_back({p + ".gate_proj.weight", {width, d}, RandomInit::kLinear});
    t.push_back({p + ".up_proj.weight", {width, d}, RandomInit::kLinear});
    t.push_back({p + ".down_proj.weight", {d, width}, RandomInit::kLinear});
  };
  t.push_back({"model.embed_tokens.weight", {v, d}, RandomInit::kEmbed});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const std::string a = p + ".self_attn";
    t.push_back({p + ".input_layernorm.weight", {d}, RandomInit::kNorm});
    t.push_back({a + ".q_proj.weight", {q_rows, d}, RandomInit::kLinear});
    t.push_back({a + ".k_proj.weight", {kv_rows, d}, RandomInit::kLinear});
    t.push_back({a + ".v_proj.weight", {kv_rows, d}, RandomInit::kLinear});
    t.push_back({a + ".o_proj.weight", {d, q_rows}, RandomInit::kLinear});
    t.push_back({a + ".q_norm.weight", {dh}, RandomInit::kNorm});
    t.push_back({a + ".k_norm.weight", {dh}, RandomInit::kNorm});
    t.push_back({p + ".post_attention_layernorm.weight", {d}, RandomInit::kNorm});
    if (!c.is_moe_layer(l)) {
      mlp(p + ".mlp", c.intermediate_size);
      continue;
    }
    t.push_back({p + ".mlp.gate.weight", {c.num_experts, d}, RandomInit::kRouter});
    for (int64_t e = 0; e < c.num_experts; ++e)
      mlp(p + ".mlp.experts." + std::to_string(e), c.moe_intermediate_size);
  }
  t.push_back({"model.norm.weight", {d}, RandomInit::kNorm});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {v, d}, RandomInit::kLinear});
  return t;
}

Status write_text(const std::string& path, const std::string& text) {
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(text));
  return f.commit();
}

}  // namespace

Result<Qwen3MoeConfig> qwen3_mkmodel_config(const MkModelOptions& o) {
  if (o.weights_int8 || !o.weights_int4.empty() || !o.from_dir.empty() || !o.router_skew.empty()) {
    return unimplemented(
        "mkmodel --arch qwen3_moe: --weights-int8, --weights-int4, --from and --router-skew are "
        "not supported for Qwen3-MoE yet");
  }
  if (o.dtype != "bf16" && o.dtype != "f16") {
    return invalid_argument("mkmodel --arch qwen3_moe: --dtype must be bf16 or f16, got '{}'",
                            o.dtype);
  }
  Qwen3MoeConfig c;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
  c.rope_theta = 1e6;
  c.norm_topk_prob = true;
  if (o.preset == "tiny") {
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.moe_intermediate_size = 32;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.mlp_only_layers = {0};
    c.max_position_embeddings = 512;
  } else if (o.preset == "bench-qwen3") {
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.moe_intermediate_size = 768;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.max_position_embeddings = 40960;
  } else {
    return invalid_argument(
        "mkmodel --arch qwen3_moe: --preset must be tiny or bench-qwen3, got '{}'", o.preset);
  }
  if (o.max_position_embeddings) c.max_position_embeddings = *o.max_position_embeddings;
  if (c.max_position_embeddings < 1 || (o.yarn && c.max_position_embeddings % 4 != 0)) {
    return invalid_argument(
        "mkmodel: --max-position-embeddings {}: expected >= 1 (a multiple of 4 with --yarn)",
        c.max_position_embeddings);
  }
  if (o.yarn) {
    RopeScaling r;
    r.factor = 4.0;
    r.original_max_position_embeddings = c.max_position_embeddings / 4;
    c.rope_scaling = r;
  }
  return c;
}

Status write_qwen3_checkpoint(const MkModelOptions& o) {
  XDS_ASSIGN_OR_RETURN(const Qwen3MoeConfig c, qwen3_mkmodel_config(o));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return internal_error("{}: cannot create the directory: {}", o.out_dir, ec.message());
  const bool f16 = o.dtype == "f16";
  const std::string config_text = qwen3_config_json(c, f16).dump(2) + "\n";
  // The config must read back as the same model (guards the key names above).
  XDS_RETURN_IF_ERROR(parse_qwen3_moe_config(config_text, o.out_dir + "/config.json").status());
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/config.json", config_text));
  const ojson gen = {{"bos_token_id", 0}, {"eos_token_id", 1}};
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/generation_config.json", gen.dump(2) + "\n"));
  return write_random_tensors(o, qwen3_tensors(c), f16 ? DType::kF16 : DType::kBF16);
}

}  // namespace xds

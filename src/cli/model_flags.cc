#include "cli/model_flags.h"

#include "base/memory_info.h"
#include "model/registry.h"
#include "model/speculative_decode.h"

namespace xds::cli {

Status parse_dtype_flags(const std::string& compute, const std::string& kv_cache,
                         ModelOptions& mo) {
  if (compute == "f32") {
    mo.compute = ComputeDType::kF32;
  } else if (compute == "bf16") {
    mo.compute = ComputeDType::kBF16;
  } else {
    return invalid_argument("--compute-dtype must be f32 or bf16, got '{}'", compute);
  }
  if (kv_cache == "auto") {
    mo.kv_cache = KvCacheDType::kAuto;
  } else if (kv_cache == "f32") {
    mo.kv_cache = KvCacheDType::kF32;
  } else if (kv_cache == "bf16") {
    mo.kv_cache = KvCacheDType::kBF16;
  } else if (kv_cache == "int8") {
    mo.kv_cache = KvCacheDType::kInt8;
  } else {
    return invalid_argument("--kv-cache-dtype must be auto, f32, bf16 or int8, got '{}'",
                            kv_cache);
  }
  return {};
}

Status parse_activation_flag(const std::string& activation, ModelOptions& mo) {
  if (activation == "auto") {
    mo.activation = ActivationDType::kAuto;
  } else if (activation == "int8") {
    mo.activation = ActivationDType::kInt8;
  } else {
    return invalid_argument("--activation-dtype must be auto or int8, got '{}'", activation);
  }
  return {};
}

Status parse_attention_flag(const std::string& attention, ModelOptions& mo) {
  if (attention == "auto") {
    mo.attention = AttentionMode::kAuto;
  } else if (attention == "absorbed") {
    mo.attention = AttentionMode::kAbsorbed;
  } else if (attention == "expanded") {
    mo.attention = AttentionMode::kExpanded;
  } else {
    return invalid_argument("--attention must be auto, absorbed or expanded, got '{}'", attention);
  }
  return {};
}

Result<KvCache> make_kv_cache(const CausalLm& model, int64_t tokens) {
  constexpr int64_t kBlock = 16;
  KvStorageShape shape;
  shape.layout = model.kv_layout();
  shape.block_size = kBlock;
  shape.num_blocks = (tokens + kBlock - 1) / kBlock;
  return KvCache::create(shape, available_memory_bytes());
}

std::string kv_cache_dtype_name(const CausalLm& model) {
  const KvLayout layout = model.kv_layout();
  return layout.planes.empty() ? std::string("none")
                               : std::string(dtype_name(layout.planes[0].dtype));
}

void add_speculative_flags(CLI::App* cmd, SpeculativeFlags& f) {
  cmd->add_option("--speculative-tokens", f.tokens,
                  "MTP speculative decoding: k draft tokens per step, verified by the main model "
                  "in one pass (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{16}));
  cmd->add_option("--speculative-mtp-layers", f.mtp_layers,
                  "MTP layers the drafts use: draft i runs layer min(i, N) and reuses the last "
                  "after that (0: all the checkpoint has)")
      ->check(CLI::NonNegativeNumber);
}

Status check_speculative_flags(const SpeculativeFlags& f, const std::string& model_dir) {
  if (f.tokens == 0) {
    if (f.mtp_layers > 0) {
      return invalid_argument("--speculative-mtp-layers {} needs --speculative-tokens k > 0",
                              f.mtp_layers);
    }
    return {};
  }
  XDS_ASSIGN_OR_RETURN(const ModelInfo info, load_model_info(model_dir));
  auto spec = mtp_spec_config(f.tokens, f.mtp_layers, info.n_mtp_layers);
  if (!spec.ok()) {
    return invalid_argument("--speculative-tokens {} with the model in {}: {}", f.tokens,
                            model_dir, spec.status().message());
  }
  return {};
}

}  // namespace xds::cli

#include "cli/model_flags.h"

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
  } else {
    return invalid_argument("--kv-cache-dtype must be auto, f32 or bf16, got '{}'", kv_cache);
  }
  return {};
}

}  // namespace xds::cli

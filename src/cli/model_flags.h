// The model flags that generate and perplexity share: --compute-dtype and --kv-cache-dtype.
#pragma once

#include <string>

#include "base/status.h"
#include "model/deepseek_v3.h"

namespace xds::cli {

inline constexpr const char* kComputeDTypeHelp = "f32 (reference) or bf16 (fast)";
inline constexpr const char* kKvCacheDTypeHelp =
    "KV cache elements: auto (bf16 with --compute-dtype bf16 where the CPU has AVX512_BF16, "
    "else f32), f32 or bf16";

// Sets mo.compute and mo.kv_cache from the flags' text; InvalidArgument naming the flag and
// the value otherwise. (Combinations the model cannot run are refused by its load().)
Status parse_dtype_flags(const std::string& compute, const std::string& kv_cache, ModelOptions& mo);

}  // namespace xds::cli

// The model flags that several commands share: --compute-dtype, --kv-cache-dtype and
// --activation-dtype (generate, perplexity, serve, instance), --speculative-tokens and --speculative-mtp-layers
// (generate, serve, instance); and the KV cache of a command that runs its sequences itself.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "model/causal_lm.h"
#include "model/kv_cache.h"

namespace xds::cli {

inline constexpr const char* kComputeDTypeHelp = "f32 (reference) or bf16 (fast)";
inline constexpr const char* kKvCacheDTypeHelp =
    "KV cache elements: auto (bf16 with --compute-dtype bf16 where the CPU has AVX512_BF16, "
    "else f32), f32, bf16 or int8 (the latent in INT8 with a scale per row, the rope part as "
    "auto stores it)";

// Sets mo.compute and mo.kv_cache from the flags' text; InvalidArgument naming the flag and
// the value otherwise. (Combinations the model cannot run are refused by its load().)
Status parse_dtype_flags(const std::string& compute, const std::string& kv_cache, ModelOptions& mo);

inline constexpr const char* kActivationDTypeHelp =
    "Activations of integer linears: auto (as the checkpoint's quantization_config says) or "
    "int8 (a W4A16 checkpoint run as W4A8: per-token int8 activations)";
// Sets mo.activation from --activation-dtype's text (auto or int8).
Status parse_activation_flag(const std::string& activation, ModelOptions& mo);

// Sets mo.attention from --attention's text (auto, absorbed or expanded).
Status parse_attention_flag(const std::string& attention, ModelOptions& mo);

// A KvCache of `model`'s planes (CausalLm::kv_layout) with room for `tokens` positions in
// blocks of 16; ResourceExhausted when the machine lacks the memory (KvCache::create).
Result<KvCache> make_kv_cache(const CausalLm& model, int64_t tokens);
// The element type of the cache's first plane (the latent): "F32", "BF16" or "I8".
std::string kv_cache_dtype_name(const CausalLm& model);

// MTP speculative decoding: k drafts per step (0: off) and the MTP layers they use (0: all).
struct SpeculativeFlags {
  int64_t tokens = 0;
  int64_t mtp_layers = 0;
};
void add_speculative_flags(CLI::App* cmd, SpeculativeFlags& f);
// InvalidArgument, naming the flag, when the flags do not fit the model in `model_dir` (no
// MTP layers, k or the layer cap out of range, a layer cap without k). Reads config.json only.
Status check_speculative_flags(const SpeculativeFlags& f, const std::string& model_dir);

}  // namespace xds::cli

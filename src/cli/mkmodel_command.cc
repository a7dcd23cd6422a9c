// `xdeepserve mkmodel`: write a random-weight checkpoint of a registry family
// (mkmodel/mkmodel.h, mkmodel/qwen3_checkpoint.h).
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "mkmodel/mkmodel.h"

namespace xds::cli {

void add_mkmodel_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<MkModelOptions>();
  CLI::App* cmd =
      app.add_subcommand("mkmodel",
                         "Write a random-weight DeepSeek-V3, Kimi K2, DeepSeek-V2, Qwen3-MoE or "
                         "GLM-4.5 checkpoint (HF layout)");
  cmd->add_option("--out", opts->out_dir, "Output directory")->required();
  CLI::Option* preset =
      cmd->add_option("--preset", opts->preset,
                      "tiny (a few MB), bench-2.6b (~5.9 GB in bf16; DeepSeek families) or "
                      "bench-qwen3 (~8.7 GB in bf16; qwen3_moe)")
          ->check(CLI::IsMember({"tiny", "bench-2.6b", "bench-qwen3"}));
  cmd->add_option("--arch", opts->arch,
                  "deepseek_v3 (default), kimi_k2, deepseek_v2 (with --no-q-lora: the "
                  "DeepSeek-V2-Lite layout), qwen3_moe (presets tiny, bench-qwen3) or glm4_moe "
                  "(preset tiny): config.json's model_type and that family's published fields")
      ->check(CLI::IsMember({"deepseek_v3", "kimi_k2", "deepseek_v2", "qwen3_moe", "glm4_moe"}));
  cmd->add_flag("--weights-int8", opts->weights_int8,
                "W8A8 (compressed-tensors, round to nearest per output channel): attention and "
                "MLP projections as I8 + weight_scale");
  cmd->add_flag("--int8-head-and-kv-b", opts->int8_head_and_kv_b,
                "With --weights-int8 or --weights-int4 (pack-quantized): lm_head, "
                "shared_head.head and kv_b_proj as I8 + weight_scale too (not in ignore; W4: a "
                "second, int8 config group)");
  CLI::Option* int4 =
      cmd->add_option(
             "--weights-int4", opts->weights_int4,
             "sym or asym: 4-bit round to nearest per group of input columns (W4A16; --int4-format "
             "pack-quantized, compressed-tensors, or gptq): attention and MLP projections and "
             "kv_b_proj "
             "whose input width is a multiple of --group-size")
          ->check(CLI::IsMember({"sym", "asym"}));
  cmd->add_option("--group-size", opts->int4_group_size, "With --weights-int4: 32, 64 or 128")
      ->check(CLI::IsMember({32, 64, 128}))
      ->needs(int4);
  cmd->add_option("--int4-format", opts->int4_format,
                  "With --weights-int4: pack-quantized (default) or gptq (v1, zero points minus 1)")
      ->check(CLI::IsMember({"pack-quantized", "gptq"}))
      ->needs(int4);
  cmd->add_option("--int4-actorder", opts->int4_actorder,
                  "With --weights-int4: none (default: column c in group c / G) or group (each "
                  "module's columns grouped by a seeded permutation, written as g_idx)")
      ->check(CLI::IsMember({"none", "group"}))
      ->needs(int4);
  cmd->add_flag("--int4-int8-activations", opts->int4_int8_activations,
                "With --weights-int4 pack-quantized: a W4A8 config (per-token int8 activations)")
      ->needs(int4);
  CLI::Option* from = cmd->add_option(
      "--from", opts->from_dir,
      "With --weights-int8 or --weights-int4: an RTN copy of this (BF16/F16/F32) checkpoint "
      "instead of a random model");
  from->excludes(preset);
  cmd->add_option("--dtype", opts->dtype, "bf16, f16, or fp8 (128x128 block scales as published)")
      ->check(CLI::IsMember({"bf16", "f16", "fp8"}));
  cmd->add_option("--seed", opts->seed, "Seed of the weights");
  cmd->add_option("--shards", opts->shards, "Number of safetensors files (1: model.safetensors)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option_function<int>(
         "--mtp-layers", [opts](int n) { opts->mtp_layers = n; },
         "num_nextn_predict_layers (default: deepseek_v3 and glm4_moe 1, kimi_k2 0; "
         "deepseek_v2 has none)")
      ->check(CLI::Range(0, 8));
  cmd->add_option_function<double>(
         "--partial-rotary-factor", [opts](double f) { opts->partial_rotary_factor = f; },
         "glm4_moe: the share of each head's dims that rotate (default 0.5, as published)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag_function(
      "--no-attention-bias", [opts](int64_t) { opts->attention_bias = false; },
      "glm4_moe: attention_bias false (no q/k/v biases)");
  cmd->add_flag_function(
      "--no-qk-norm", [opts](int64_t) { opts->qk_norm = false; },
      "glm4_moe: use_qk_norm false (GLM-4.5-Air's attention)");
  cmd->add_flag("--yarn", opts->yarn, "Add rope_scaling yarn (factor 4)");
  cmd->add_option_function<int64_t>(
         "--max-position-embeddings", [opts](int64_t n) { opts->max_position_embeddings = n; },
         "max_position_embeddings in config.json (default: the preset's, tiny 512, bench-2.6b "
         "4096; with --yarn a multiple of 4)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag_function(
      "--no-q-lora", [opts](int64_t) { opts->q_lora = false; },
      "q_proj instead of q_a_proj/q_b_proj (q_lora_rank null)");
  CLI::Option* skew = cmd->add_option(
      "--router-skew", opts->router_skew,
      "zipf:A: fit e_score_correction_bias so that the expert of rank r (a seeded permutation "
      "per MoE layer) is chosen ~ 1/(r+1)^A of the time; A in (0, 8]");
  cmd->add_option("--router-skew-seed", opts->router_skew_seed,
                  "Seed of --router-skew's expert permutations")
      ->needs(skew);
  cmd->add_option("--threads", opts->threads, "Worker threads (0: all cores)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->callback([opts, exit_code, preset, from] {
    if (preset->count() == 0 && from->count() == 0) {
      std::fprintf(stderr, "error: mkmodel: --preset or --from is required\n");
      *exit_code = 1;
      return;
    }
    const Status s = write_random_checkpoint(*opts);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = 1;
      return;
    }
    const std::string scheme =
        opts->weights_int4.empty()
            ? std::string(opts->int8_head_and_kv_b ? "W8A8, int8 lm_head and kv_b_proj" : "W8A8")
            : fmt::format("W4{} {} G{} {}{}", opts->int4_int8_activations ? "A8" : "A16",
                          opts->weights_int4, opts->int4_group_size, opts->int4_format,
                          opts->int4_actorder == "group" ? " actorder group" : "") +
                  (opts->int8_head_and_kv_b ? ", int8 lm_head and kv_b_proj" : "");
    if (!opts->from_dir.empty()) {
      std::fprintf(stderr, "wrote %s (%s RTN copy of %s, %d shard%s)\n", opts->out_dir.c_str(),
                   scheme.c_str(), opts->from_dir.c_str(), opts->shards,
                   opts->shards == 1 ? "" : "s");
      return;
    }
    std::fprintf(
        stderr, "wrote %s (%s, preset %s, %s%s, seed %llu, %d shard%s%s%s)\n",
        opts->out_dir.c_str(), opts->arch.c_str(), opts->preset.c_str(), opts->dtype.c_str(),
        opts->weights_int8 || !opts->weights_int4.empty() ? (" + " + scheme).c_str() : "",
        static_cast<unsigned long long>(opts->seed), opts->shards, opts->shards == 1 ? "" : "s",
        opts->router_skew.empty() ? "" : ", router skew ", opts->router_skew.c_str());
  });
}

}  // namespace xds::cli

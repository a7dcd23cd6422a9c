// `xdeepserve quantize`: an offline W8A8, W4A16 or W4A8 (compressed-tensors) copy of a float
// checkpoint, calibrated: SmoothQuant (int8 activations only) + GPTQ (quant/quantize.h,
// docs/design/quantize.md).
#include <cctype>
#include <cstdio>
#include <string>
#include <memory>

#include "cli/commands.h"
#include "quant/quantize.h"

namespace xds::cli {

void add_quantize_command(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write a calibrated W8A8, W4A16 or W4A8 copy of a checkpoint (SmoothQuant + GPTQ)");
  cmd->add_option("--model", o->model_dir, "Checkpoint directory (BF16, F16, F32 or block FP8)")
      ->required();
  cmd->add_option("--out", o->out_dir, "Output directory (must not exist)")->required();
  cmd->add_option("--calibration", o->calibration_file,
                  "Calibration text (UTF-8; training text, not the held-out text)")
      ->required();
  cmd->add_option("--samples", o->samples,
                  "Calibration windows (at least; more while an expert lacks tokens; default 32)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--window", o->window, "Tokens per calibration window (default 256)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option("--smooth-alpha", o->smooth_alpha,
                  "SmoothQuant migration strength in [0, 1] (default 0.5); negative: no smoothing")
      ->check(finite_range(-1.0, 1.0));
  cmd->add_option("--scheme", o->scheme,
                  "w8a8 (default: int8 per-channel weights), w4a16 or w4a8 (4-bit weight groups, "
                  "compressed-tensors pack-quantized; w4a8 with int8 activations)")
      ->check(CLI::IsMember({"w8a8", "w4a16", "w4a8"}));
  cmd->add_option("--group-size", o->group_size,
                  "With --scheme w4a16 or w4a8: input columns per 4-bit scale, 32, 64 or 128 "
                  "(default 128)");
  cmd->add_flag("--int8-head-and-kv-b", o->int8_head_and_kv_b,
                "lm_head and kv_b_proj as int8 per output channel too (round to nearest), not in "
                "quantization_config's ignore; with w4a16/w4a8 in a second, int8 config group");
  cmd->add_option("--method", o->method, "gptq (default) or rtn (round to nearest, after the smoothing)")->check(CLI::IsMember({"gptq", "rtn"}));
  cmd->add_option("--min-expert-samples", o->min_expert_samples,
                  "Tokens each routed expert must see for GPTQ (fewer: RTN, reported; default 4)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--damp", o->damp, "GPTQ damping, relative to the Hessian's mean diagonal (default 0.01)")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--threads", o->threads, "Worker threads (0: all cores)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->callback([o, exit_code] {
    const Status s = quantize_checkpoint(*o);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = 1;
      return;
    }
    std::string scheme = o->scheme;
    for (char& ch : scheme) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (o->scheme != "w8a8") scheme += ", G " + std::to_string(o->group_size ? o->group_size : 128);
    std::fprintf(stderr, "wrote %s (%s, %s, report in quantize_report.json)\n",
                 o->out_dir.c_str(), scheme.c_str(), o->method.c_str());
  });
}

}  // namespace xds::cli

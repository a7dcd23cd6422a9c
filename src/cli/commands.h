// Subcommands of the `xdeepserve` binary. Each add_*_command registers one subcommand on
// the app; its callback sets `*exit_code` (0 ok, 1 runtime error, 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace xds::cli {

// A number in [lo, hi], NaN refused (CLI::Range lets NaN through: every comparison with it
// is false).
inline CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo || v > hi)
          return "Value " + text + " not a number in [" + CLI::detail::to_string(lo) + ", " +
                 CLI::detail::to_string(hi) + "]";
        return {};
      },
      "FLOAT in [" + CLI::detail::to_string(lo) + " - " + CLI::detail::to_string(hi) + "]");
}

// Non-finite logits mean the weights or the activations went NaN or Inf: a wrong
// checkpoint, to report (DataLoss naming the model, the position and the first such logit),
// never a token to emit or a perplexity to print.
inline xds::Status check_finite_logits(const std::string& model, int64_t position, const float* row,
                                       int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(row[i])) {
      return xds::data_loss(
          "{}: the logits at position {} are not finite (token {}: {}); the checkpoint's "
          "weights hold NaN or Inf, or its activations overflow",
          model, position, i, row[i]);
    }
  }
  return {};
}

// Worker threads a command may ask for (0: one per core). More than this is a typo, and
// asking the OS for 100000 threads aborted the process.
inline constexpr int kMaxThreads = 1024;

void add_generate_command(CLI::App& app, int* exit_code);
void add_mkmodel_command(CLI::App& app, int* exit_code);
void add_tokenize_command(CLI::App& app, int* exit_code);
void add_perplexity_command(CLI::App& app, int* exit_code);
// serve, instance and gateway (serve_command.cc).
void add_serve_commands(CLI::App& app, int* exit_code);
void add_bench_command(CLI::App& app, int* exit_code);
void add_eplb_command(CLI::App& app, int* exit_code);
void add_quantize_command(CLI::App& app, int* exit_code);

}  // namespace xds::cli

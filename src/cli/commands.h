// Subcommands of the `xdeepserve` binary. Each add_*_command registers one subcommand on
// the app; its callback sets `*exit_code` (0 ok, 1 runtime error, 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

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

// Worker threads a command may ask for (0: one per core). More than this is a typo, and
// asking the OS for 100000 threads aborted the process.
inline constexpr int kMaxThreads = 1024;

void add_generate_command(CLI::App& app, int* exit_code);
void add_mkmodel_command(CLI::App& app, int* exit_code);
void add_tokenize_command(CLI::App& app, int* exit_code);
void add_perplexity_command(CLI::App& app, int* exit_code);

}  // namespace xds::cli

// Subcommands of the `xdeepserve` binary. Each add_*_command registers one subcommand on
// the app; its callback sets `*exit_code` (0 ok, 1 runtime error, 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>

namespace xds::cli {

void add_generate_command(CLI::App& app, int* exit_code);
void add_mkmodel_command(CLI::App& app, int* exit_code);
void add_tokenize_command(CLI::App& app, int* exit_code);
void add_perplexity_command(CLI::App& app, int* exit_code);

}  // namespace xds::cli

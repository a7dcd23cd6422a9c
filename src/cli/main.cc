// xdeepserve: the one binary. Subcommands are registered in this table.
#include "cli/commands.h"
#include "kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  xds::kernels::select_blas_core(argv);  // first: it may re-execute the program
  CLI::App app{"xdeepserve: serving large Mixture-of-Experts language models"};
  app.require_subcommand(1);
  int exit_code = 0;
  // One line per subcommand (commands.h).
  xds::cli::add_generate_command(app, &exit_code);
  xds::cli::add_mkmodel_command(app, &exit_code);
  xds::cli::add_tokenize_command(app, &exit_code);
  xds::cli::add_perplexity_command(app, &exit_code);
  xds::cli::add_serve_commands(app, &exit_code);
  xds::cli::add_bench_command(app, &exit_code);
  xds::cli::add_eplb_command(app, &exit_code);
  xds::cli::add_quantize_command(app, &exit_code);
  (void)&exit_code;
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}

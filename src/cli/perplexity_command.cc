// `xdeepserve perplexity`: perplexity of a text file under the model.
//
// Definition (the same as the model card of models/kjv-moe-tiny):
//   tokens  = the tokenizer's ids for the file's UTF-8 bytes, no BOS/EOS added;
//   windows = consecutive non-overlapping slices of W tokens (the last may be shorter and
//             counts if it has >= 2 tokens), each run alone from position 0;
//   perplexity = exp(mean over every window and position i >= 1 of -log p(token_i | prefix)),
//             log-softmax over the model's whole vocabulary, in double.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/clock.h"
#include "base/read_file.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "model/deepseek_v3.h"
#include "tokenizer/tokenizer.h"

namespace xds::cli {
namespace {

struct PerplexityArgs {
  std::string model;
  std::string file;
  int64_t window = 512;
  std::string compute_dtype = "f32";
  std::string kv_cache_dtype = "auto";
  int threads = 0;
};

Status run_perplexity(const PerplexityArgs& a) {
  auto text = read_whole_file(a.file);
  if (!text.ok()) return Status(text.status().code(), "--file: " + text.status().message());
  if (!Tokenizer::has_tokenizer_files(a.model)) {
    return failed_precondition("{}: no tokenizer files (tokenizer.json): perplexity needs text",
                               a.model);
  }
  XDS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.model));
  XDS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(*text, /*add_special_tokens=*/false));
  ModelOptions mo;
  XDS_RETURN_IF_ERROR(parse_dtype_flags(a.compute_dtype, a.kv_cache_dtype, mo));
  mo.threads = a.threads;
  XDS_ASSIGN_OR_RETURN(auto model, DeepseekV3Model::load(a.model, mo));
  const int64_t vocab = model->config().vocab_size;
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t windows = (n + a.window - 1) / a.window;
  if (const int64_t longest = std::min(a.window, n);
      longest > model->config().max_position_embeddings) {
    return invalid_argument(
        "--window {}: windows of {} tokens exceed the model's max_position_embeddings {}", a.window,
        longest, model->config().max_position_embeddings);
  }
  double nll = 0.0;
  int64_t count = 0;
  StepOutput out;
  const auto t0 = Clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t begin = w * a.window, len = std::min(a.window, n - begin);
    if (len < 2) continue;
    XDS_ASSIGN_OR_RETURN(KvCache cache, model->make_cache(len + 16));
    const int64_t seq = cache.add_sequence();
    XDS_ASSIGN_OR_RETURN(
        const TokenChunk ch,
        cache.chunk(seq, 0, std::span<const int32_t>(ids).subspan(begin, len), true));
    XDS_RETURN_IF_ERROR(model->forward({&ch, 1}, cache.storage(), out));
    for (int64_t i = 0; i + 1 < len; ++i) {
      const float* row = out.logits.data() + i * vocab;
      XDS_RETURN_IF_ERROR(check_finite_logits(a.model, begin + i, row, vocab));
      double mx = row[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double sum = 0.0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      nll -= static_cast<double>(row[ids[begin + i + 1]]) - mx - std::log(sum);
      ++count;
    }
    std::fprintf(stderr, "\rperplexity: window %lld/%lld, %lld tokens, running ppl %.4f, %.1f s",
                 static_cast<long long>(w + 1), static_cast<long long>(windows),
                 static_cast<long long>(count), std::exp(nll / std::max<int64_t>(count, 1)),
                 seconds_since(t0));
  }
  std::fprintf(stderr, "\n");
  if (count == 0) return invalid_argument("{}: fewer than 2 tokens, nothing to predict", a.file);
  std::printf("perplexity %.4f over %lld predicted tokens (%lld tokens, %lld windows of %lld)\n",
              std::exp(nll / count), static_cast<long long>(count), static_cast<long long>(n),
              static_cast<long long>(windows), static_cast<long long>(a.window));
  return {};
}

}  // namespace

void add_perplexity_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file");
  cmd->add_option("--model", args->model, "Model directory")->required();
  cmd->add_option("--file", args->file, "UTF-8 text file")->required();
  cmd->add_option("--window", args->window, "Tokens per window")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option("--compute-dtype", args->compute_dtype, kComputeDTypeHelp);
  cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype, kKvCacheDTypeHelp);
  cmd->add_option("--threads", args->threads, "Worker threads (0: all cores)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->callback([args, exit_code] {
    const Status s = run_perplexity(*args);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace xds::cli

// `xdeepserve perplexity`: perplexity of a text file under the model.
//
// Definition (the same as the model card of models/kjv-moe-tiny):
//   tokens  = the tokenizer's ids for the file's UTF-8 bytes, no BOS/EOS added;
//   windows = consecutive non-overlapping slices of W tokens (the last may be shorter and
//             counts if it has >= 2 tokens), each run alone from position 0;
//   perplexity = exp(mean over every window and position i >= 1 of -log p(token_i | prefix)),
//             log-softmax over the model's whole vocabulary, in double.
//
// --mtp-agreement also measures, over the same windows (teacher forcing, argmax ties to the
// lower id, whole vocabulary), the card's "MTP top-1 agreement": for t = 0 .. n-3, MTP layer
// 0's row t (main final-normed hidden at t, token t+1, position t) predicts token t+2, and so
// does the main model's row t+1; agreement is the fraction of rows where the two are the same
// token (the greedy acceptance rate of draft 1). Draft 2 the same way, as speculative
// decoding chains it (model/speculative_decode.h): for t = 0 .. n-4 the row at position t+1
// of MTP layer min(1, layers - 1) (layer 0 reused with one MTP layer) over the residual
// output of row t and the true token t+2 predicts token t+3, against the main model's row
// t+2; reported over all rows and over the rows whose draft 1 agreed (the acceptance rate at
// position 2 given position 1). --speculative-mtp-layers 1 makes draft 2 reuse layer 0 on a
// checkpoint with more. Tokens per step at k = 2 (greedy, teacher-forced): the mean over the
// draft-2 rows t of 1 + [draft 1 agreed] + [drafts 1 and 2 agreed].
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/clock.h"
#include "base/read_file.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace xds::cli {
namespace {

struct PerplexityArgs {
  std::string model;
  std::string file;
  int64_t window = 512;
  std::string compute_dtype = "f32";
  std::string kv_cache_dtype = "auto";
  std::string activation_dtype = "auto";
  int threads = 0;
  bool mtp_agreement = false;
  int64_t mtp_layers = 0;  // MTP layers the drafts use (0: all the checkpoint has)
};

struct MtpAgreement {
  int64_t rows1 = 0, agree1 = 0;                // draft 1
  int64_t rows2 = 0, agree2 = 0;                // draft 2, every row
  int64_t rows2_given1 = 0, agree2_given1 = 0;  // draft 2 where draft 1 agreed
  int64_t tokens_k2 = 0;                        // sum over draft-2 rows of 1 + accepted drafts
};

int32_t argmax_row(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}

// One window's rows (see the header). `main` holds the main model's output over the window
// (every logit row, every hidden row); the MTP layers' cache rows of `seq` are written.
Status mtp_agreement_window(CausalLm& model, KvCache& cache, int64_t seq,
                            std::span<const int32_t> ids, const StepOutput& main, int64_t layer2,
                            MtpAgreement& acc) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n < 3) return {};
  const int64_t v = model.info().vocab_size, d = model.info().hidden_size;
  std::vector<int32_t> main_top(static_cast<size_t>(n));  // [n] the main model's argmax
  for (int64_t i = 0; i < n; ++i) main_top[i] = argmax_row(main.logits.data() + i * v, v);
  // The teacher-forced rows 0 .. n-2 of layer 0 (and of the draft-2 layer if another).
  StepOutput first, second;
  XDS_ASSIGN_OR_RETURN(const MtpChunk rows,
                       cache.mtp_chunk(seq, 0, ids.subspan(1), main.hidden.data()));
  XDS_RETURN_IF_ERROR(model.forward_mtp(0, {&rows, 1}, cache.storage(), first));
  if (layer2 != 0) {
    XDS_RETURN_IF_ERROR(model.forward_mtp(layer2, {&rows, 1}, cache.storage(), second));
  }
  std::vector<bool> agreed(static_cast<size_t>(n));  // [n] draft 1 of row t agreed
  for (int64_t t = 0; t + 2 < n; ++t) {
    agreed[t] = argmax_row(first.logits.data() + t * v, v) == main_top[t + 1];
    ++acc.rows1;
    acc.agree1 += agreed[t];
  }
  // Draft 2 of row t is the chained row at position t+1, which reads rows 0 .. t: from the
  // last row down, each chained row overwrites only a row no later one reads.
  for (int64_t t = n - 4; t >= 0; --t) {
    XDS_ASSIGN_OR_RETURN(const MtpChunk chained, cache.mtp_chunk(seq, t + 1, ids.subspan(t + 2, 1),
                                                                 first.hidden.data() + t * d));
    XDS_RETURN_IF_ERROR(model.forward_mtp(layer2, {&chained, 1}, cache.storage(), second));
    const bool ok = argmax_row(second.logits.data(), v) == main_top[t + 2];
    ++acc.rows2;
    acc.agree2 += ok;
    acc.tokens_k2 += 1 + agreed[t] + (agreed[t] && ok);
    if (agreed[t]) {
      ++acc.rows2_given1;
      acc.agree2_given1 += ok;
    }
  }
  return {};
}

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
  XDS_RETURN_IF_ERROR(parse_activation_flag(a.activation_dtype, mo));
  mo.threads = a.threads;
  XDS_ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> model, load_causal_lm(a.model, mo));
  const ModelInfo& info = model->info();
  const int64_t vocab = info.vocab_size;
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t windows = (n + a.window - 1) / a.window;
  if (const int64_t longest = std::min(a.window, n);
      longest > info.max_position_embeddings) {
    return invalid_argument(
        "--window {}: windows of {} tokens exceed the model's max_position_embeddings {}", a.window,
        longest, info.max_position_embeddings);
  }
  if (a.mtp_agreement && info.n_mtp_layers == 0) {
    return invalid_argument("--mtp-agreement: {} has no MTP layer (num_nextn_predict_layers 0)",
                            a.model);
  }
  const int64_t mtp_layers = info.n_mtp_layers;
  // The MTP layer of draft 2 (0-based): min(1, used layers - 1).
  const int64_t layer2 = std::min<int64_t>(
      1, (a.mtp_layers > 0 ? std::min(a.mtp_layers, mtp_layers) : mtp_layers) - 1);
  MtpAgreement agreement;
  double nll = 0.0;
  int64_t count = 0;
  StepOutput out;
  const auto t0 = Clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t begin = w * a.window, len = std::min(a.window, n - begin);
    if (len < 2) continue;
    XDS_ASSIGN_OR_RETURN(KvCache cache, make_kv_cache(*model, len + 16));
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
    if (a.mtp_agreement) {
      XDS_RETURN_IF_ERROR(mtp_agreement_window(*model, cache, seq,
                                               std::span<const int32_t>(ids).subspan(begin, len),
                                               out, layer2, agreement));
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
  if (a.mtp_agreement) {
    auto share = [](int64_t k, int64_t n) { return n > 0 ? double(k) / n : 0.0; };
    std::printf(
        "MTP top-1 agreement: draft 1 %.4f over %lld rows; draft 2 (MTP layer %lld%s) %.4f over "
        "%lld rows, %.4f over the %lld rows whose draft 1 agreed; tokens per step at k = 2: %.4f\n",
        share(agreement.agree1, agreement.rows1), static_cast<long long>(agreement.rows1),
        static_cast<long long>(layer2), layer2 == 0 ? ", reused" : "",
        share(agreement.agree2, agreement.rows2), static_cast<long long>(agreement.rows2),
        share(agreement.agree2_given1, agreement.rows2_given1),
        static_cast<long long>(agreement.rows2_given1),
        share(agreement.tokens_k2, agreement.rows2));
  }
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
  cmd->add_option("--activation-dtype", args->activation_dtype, kActivationDTypeHelp);
  cmd->add_option("--threads", args->threads, "Worker threads (0: all cores)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_flag("--mtp-agreement", args->mtp_agreement,
                "Also report the MTP drafts' top-1 agreement with the main model (teacher "
                "forcing): draft 1 as the model card defines it, draft 2 chained as speculative "
                "decoding runs it");
  cmd->add_option("--speculative-mtp-layers", args->mtp_layers,
                  "With --mtp-agreement: MTP layers the drafts use, as generate's flag (0: all "
                  "the checkpoint has; 1: draft 2 reuses layer 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([args, exit_code] {
    const Status s = run_perplexity(*args);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace xds::cli

// `xdeepserve generate`: stream a generation from one prompt, then print throughput.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/atomic_file.h"
#include "base/clock.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "cli/prompt.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "model/registry.h"
#include "model/speculative_decode.h"

namespace xds::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  std::string chat_template;
  bool chat = false;
  int64_t max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::string compute_dtype = "f32";
  std::string attention = "auto";
  std::string kv_cache_dtype = "auto";
  std::string dump_logits;
  std::string dump_routing;
  int64_t prefill_chunk = 0;
  int threads = 0;
  SpeculativeFlags speculative;
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return invalid_argument("--prompt-ids: '{}' is not a token id", item);
    }
  }
  if (ids.empty()) return invalid_argument("--prompt-ids: no ids given");
  return ids;
}

// The request's sampling options as serve's gateway builds them for the same values, with
// the seed of choice 0 (the request's own): the same draws, so the same tokens.
engine::SamplingOptions sampling_options(const GenerateArgs& a) {
  engine::SamplingOptions so;
  so.temperature = a.temperature;
  so.top_p = a.top_p;
  so.top_k = static_cast<int32_t>(std::min<int64_t>(a.top_k, INT32_MAX));
  so.seed = a.seed;
  so.ignore_eos = a.ignore_eos;
  so.max_tokens = static_cast<int32_t>(a.max_tokens);
  return so;
}

bool is_eos(const ModelInfo& info, int32_t token) {
  return std::find(info.eos_token_ids.begin(), info.eos_token_ids.end(), token) !=
         info.eos_token_ids.end();
}

void print_stats(const GenerateArgs& a, const CausalLm& model, int64_t n_prompt,
                 double prefill_s, int64_t decode_tokens, double decode_s) {
  std::fprintf(stderr,
               "prefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld tokens in %.3f s "
               "(%.1f tokens/s); compute %s, KV cache %s\n",
               static_cast<long long>(n_prompt), prefill_s, n_prompt / std::max(prefill_s, 1e-9),
               static_cast<long long>(decode_tokens), decode_s,
               decode_tokens > 0 ? decode_tokens / std::max(decode_s, 1e-9) : 0.0,
               a.compute_dtype.c_str(), kv_cache_dtype_name(model).c_str());
}

// --speculative-tokens k > 0: MTP drafts verified by the main model, k per step
// (model/speculative_decode.h); the acceptance rule is the engine's (engine/speculative.h),
// so the sampled tokens are serve's with the same k: the acceptance test and the residual
// draw take their own draws at a position, so they differ from the plain loop's (the same
// distribution, other tokens). Greedy output is the plain loop's.
Status run_speculative(const GenerateArgs& a, CausalLm& model, PromptCodec& codec,
                       std::span<const int32_t> prompt, int64_t valid_vocab) {
  const ModelInfo& info = model.info();
  if (!a.dump_logits.empty() || !a.dump_routing.empty()) {
    return invalid_argument(
        "--dump-logits and --dump-routing write one row per position of a plain run; they "
        "cannot be combined with --speculative-tokens");
  }
  MtpSpecDecodeOptions o;
  XDS_ASSIGN_OR_RETURN(o.spec, mtp_spec_config(a.speculative.tokens, a.speculative.mtp_layers,
                                               info.n_mtp_layers));
  o.max_tokens = a.max_tokens;
  if (!a.ignore_eos) o.stop_ids.assign(info.eos_token_ids.begin(), info.eos_token_ids.end());
  o.max_length = info.max_position_embeddings;
  o.valid_vocab = valid_vocab;
  o.prefill_chunk = a.prefill_chunk;
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  XDS_ASSIGN_OR_RETURN(KvCache cache,
                       make_kv_cache(model, n_prompt + a.max_tokens + o.spec.draft_tokens + 16));

  const engine::SamplingOptions so = sampling_options(a);
  engine::Sampler sampler;
  engine::SpecVerifyResult verdict;
  const int64_t vocab = info.vocab_size;
  auto accept = [&](const MtpSpecRows& rows, std::vector<int32_t>& tokens) -> Status {
    const int64_t n = static_cast<int64_t>(rows.drafts.size());
    for (int64_t r = 0; r <= n; ++r) {  // row r holds the logits at position - 1 + r
      XDS_RETURN_IF_ERROR(check_finite_logits(a.model, rows.position - 1 + r,
                                              rows.logits + r * vocab, valid_vocab));
    }
    engine::SpecVerifyInput in;
    in.logits = rows.logits;
    in.row_stride = vocab;
    in.valid_vocab = valid_vocab;
    in.drafts = rows.drafts;
    in.options = &so;
    in.prompt = prompt;
    in.output = rows.output;
    in.position = rows.position;
    XDS_RETURN_IF_ERROR(engine::speculative_accept(sampler, in, verdict));
    tokens.insert(tokens.end(), verdict.tokens.begin(), verdict.tokens.end());
    return {};
  };
  MtpSpecDecoder dec(model, cache, cache.add_sequence(), o, accept);
  engine::TokenDelta delta;
  auto emit = [&] {
    const std::span<const int32_t> run = dec.last_emitted();
    delta.tokens.assign(run.begin(), run.end());
    delta.finish_reason.clear();
    if (dec.finished()) {
      delta.finish_reason = !run.empty() && is_eos(info, run.back()) && !a.ignore_eos ? "stop"
                                                                                      : "length";
    }
    codec.emit(delta);
  };
  const auto t0 = Clock::now();
  XDS_RETURN_IF_ERROR(dec.prefill(prompt));
  const double prefill_s = seconds_since(t0);
  emit();
  const auto t1 = Clock::now();
  while (!dec.finished()) {
    XDS_RETURN_IF_ERROR(dec.step());
    emit();
  }
  const double decode_s = seconds_since(t1);
  codec.finish();
  const MtpSpecStats& st = dec.stats();
  std::string rates;
  for (size_t i = 0; i < st.accepted_at.size(); ++i) {
    rates += fmt::format(" {:.3f}", st.verified_at[i] > 0 ? double(st.accepted_at[i]) /
                                                                st.verified_at[i]
                                                          : 0.0);
  }
  std::fprintf(stderr,
               "speculative: %lld drafts per step from %lld MTP layer(s); %lld steps; acceptance "
               "per draft position:%s; mean tokens per step %.3f\n",
               static_cast<long long>(o.spec.draft_tokens), static_cast<long long>(o.spec.layers),
               static_cast<long long>(st.steps), rates.c_str(),
               st.steps > 0 ? double(st.step_tokens) / st.steps : 0.0);
  print_stats(a, model, n_prompt, prefill_s, static_cast<int64_t>(dec.output().size()) - 1,
              decode_s);
  return {};
}

Status run_generate(const GenerateArgs& a) {
  if (!(a.top_p > 0.0f)) {  // serve's range: the sampler keeps at least one candidate
    return invalid_argument("--top-p must be greater than 0 and at most 1, got {}", a.top_p);
  }
  ModelOptions mo;
  XDS_RETURN_IF_ERROR(parse_dtype_flags(a.compute_dtype, a.kv_cache_dtype, mo));
  XDS_RETURN_IF_ERROR(parse_attention_flag(a.attention, mo));
  mo.threads = a.threads;
  XDS_ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> model, load_causal_lm(a.model, mo));
  const ModelInfo& info = model->info();

  XDS_ASSIGN_OR_RETURN(PromptCodec codec, PromptCodec::open(a.model, a.chat_template));
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    XDS_ASSIGN_OR_RETURN(prompt, parse_ids(a.prompt_ids));
  } else {
    XDS_ASSIGN_OR_RETURN(prompt, codec.encode_prompt(a.prompt, a.chat));
  }
  const int64_t valid_vocab = codec.valid_vocab(info.vocab_size);

  const int64_t total = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  if (total > info.max_position_embeddings) {
    return invalid_argument(
        "prompt ({} tokens) + --max-tokens {} exceeds the model's max_position_embeddings {}",
        prompt.size(), a.max_tokens, info.max_position_embeddings);
  }
  if (a.speculative.tokens > 0) return run_speculative(a, *model, codec, prompt, valid_vocab);
  XDS_RETURN_IF_ERROR(check_speculative_flags(a.speculative, a.model));
  XDS_ASSIGN_OR_RETURN(KvCache cache, make_kv_cache(*model, total + 16));
  const int64_t seq = cache.add_sequence();

  // The dumps appear whole or not at all: a run that fails midway (non-finite logits, a
  // full disk) leaves no truncated file that a comparison script could read as complete.
  std::optional<AtomicFile> logits_file, routing_file;
  if (!a.dump_logits.empty()) {
    auto f = AtomicFile::create(a.dump_logits);
    if (!f.ok()) return invalid_argument("--dump-logits: {}", f.status().message());
    logits_file.emplace(std::move(*f));
  }
  if (!a.dump_routing.empty()) {
    auto f = AtomicFile::create(a.dump_routing);
    if (!f.ok()) return invalid_argument("--dump-routing: {}", f.status().message());
    routing_file.emplace(std::move(*f));
  }
  int64_t step_start = 0;
  if (routing_file) {
    model->set_routing_observer([&](int64_t layer, int64_t token,
                                    std::span<const int32_t> experts) {
      // A failed write is kept by the file and returned by commit().
      (void)routing_file->write(fmt::format("{{\"layer\":{},\"row\":{},\"experts\":[{}]}}\n", layer,
                                            step_start + token, fmt::join(experts, ",")));
    });
  }
  const bool dump = logits_file.has_value();
  auto write_rows = [&](const StepOutput& out) -> Status {
    if (!dump) return {};
    return logits_file->write(out.logits.data(), out.logits.size() * sizeof(float));
  };

  // Prefill, in chunks of --prefill-chunk tokens over the cached blocks (0: one chunk).
  StepOutput out;
  const auto t0 = Clock::now();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t chunk = a.prefill_chunk > 0 ? a.prefill_chunk : n_prompt;
  for (int64_t p = 0; p < n_prompt; p += chunk) {
    const int64_t count = std::min(chunk, n_prompt - p);
    step_start = p;
    XDS_ASSIGN_OR_RETURN(
        const TokenChunk tc,
        cache.chunk(seq, p, std::span<const int32_t>(prompt).subspan(p, count), dump));
    XDS_RETURN_IF_ERROR(model->forward({&tc, 1}, cache.storage(), out));
    XDS_RETURN_IF_ERROR(write_rows(out));
  }
  const double prefill_s = seconds_since(t0);

  // Each token is drawn as serve's DP group draws it: the engine's sampler, keyed by (seed,
  // the position being sampled, draw 0), penalties over the output so far.
  const engine::SamplingOptions so = sampling_options(a);
  engine::Sampler sampler;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());  // prompt, then output
  engine::TokenDelta delta;
  const int64_t vocab = info.vocab_size;
  const float* row = out.logits.data() + (out.logits.size() - vocab);
  int64_t generated = 0;
  const auto t1 = Clock::now();
  while (generated < a.max_tokens) {
    const int64_t pos = static_cast<int64_t>(tokens.size());
    XDS_RETURN_IF_ERROR(check_finite_logits(a.model, pos - 1, row, valid_vocab));
    engine::SampleInput in;
    in.logits = row;
    in.valid_vocab = valid_vocab;
    in.options = &so;
    in.prompt = prompt;
    in.output = std::span<const int32_t>(tokens).subspan(prompt.size());
    in.position = pos;
    XDS_ASSIGN_OR_RETURN(const int32_t next, sampler.sample(in, nullptr));
    tokens.push_back(next);
    ++generated;
    delta.tokens.assign(1, next);
    delta.finish_reason = is_eos(info, next) && !a.ignore_eos ? "stop"
                          : generated == a.max_tokens        ? "length"
                                                             : "";
    codec.emit(delta);
    if (!delta.finish_reason.empty()) break;
    step_start = pos;
    XDS_ASSIGN_OR_RETURN(const TokenChunk tc,
                         cache.chunk(seq, pos, std::span<const int32_t>(tokens).subspan(pos, 1)));
    XDS_RETURN_IF_ERROR(model->forward({&tc, 1}, cache.storage(), out));
    XDS_RETURN_IF_ERROR(write_rows(out));
    row = out.logits.data();
  }
  const double decode_s = seconds_since(t1);
  codec.finish();
  if (logits_file) XDS_RETURN_IF_ERROR(logits_file->commit());
  if (routing_file) {
    model->set_routing_observer(nullptr);
    XDS_RETURN_IF_ERROR(routing_file->commit());
  }
  print_stats(a, *model, n_prompt, prefill_s, generated - 1, decode_s);
  return {};
}

}  // namespace

void add_generate_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Stream a generation from one prompt");
  cmd->add_option("--model", args->model, "Model directory (Hugging Face layout)")->required();
  auto* text = cmd->add_option("--prompt", args->prompt, "Prompt text");
  auto* ids =
      cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, comma-separated");
  text->excludes(ids);
  cmd->add_flag("--chat", args->chat, "Apply the model's chat template to the prompt");
  cmd->add_option("--chat-template", args->chat_template,
                  "Jinja chat template file overriding the model's");
  cmd->add_option("--max-tokens", args->max_tokens, "Tokens to generate")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--temperature", args->temperature, "0 is greedy")
      ->check(finite_range(0.0, 100.0));
  cmd->add_option("--top-p", args->top_p)->check(finite_range(0.0, 1.0));
  cmd->add_option("--top-k", args->top_k)->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", args->seed);
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the end-of-sequence token");
  cmd->add_option("--compute-dtype", args->compute_dtype, kComputeDTypeHelp);
  cmd->add_option("--attention", args->attention, "Prefill attention: auto, absorbed or expanded");
  cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype, kKvCacheDTypeHelp);
  cmd->add_option("--dump-logits", args->dump_logits,
                  "Write float32 logits [rows, vocab] of every position");
  cmd->add_option("--dump-routing", args->dump_routing, "Write the chosen experts as JSON lines");
  cmd->add_option("--prefill-chunk", args->prefill_chunk,
                  "Prefill in chunks of N tokens (0: one chunk)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", args->threads, "Worker threads (0: all cores)")
      ->check(CLI::Range(0, kMaxThreads));
  add_speculative_flags(cmd, args->speculative);
  cmd->callback([args, exit_code, text, ids] {
    if (text->count() == 0 && ids->count() == 0) {
      std::fprintf(stderr, "error: generate needs --prompt or --prompt-ids\n");
      *exit_code = 2;
      return;
    }
    const Status s = run_generate(*args);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace xds::cli

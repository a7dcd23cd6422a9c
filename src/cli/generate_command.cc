// `xdeepserve generate`: stream a generation from one prompt, then print throughput.
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
#include "kernels/cpu/sampling.h"
#include "model/deepseek_v3.h"

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

Status run_generate(const GenerateArgs& a) {
  ModelOptions mo;
  XDS_RETURN_IF_ERROR(parse_dtype_flags(a.compute_dtype, a.kv_cache_dtype, mo));
  if (a.attention == "auto") {
    mo.attention = AttentionMode::kAuto;
  } else if (a.attention == "absorbed") {
    mo.attention = AttentionMode::kAbsorbed;
  } else if (a.attention == "expanded") {
    mo.attention = AttentionMode::kExpanded;
  } else {
    return invalid_argument("--attention must be auto, absorbed or expanded, got '{}'",
                            a.attention);
  }
  mo.threads = a.threads;
  XDS_ASSIGN_OR_RETURN(auto model, DeepseekV3Model::load(a.model, mo));
  const DeepseekV3Config& cfg = model->config();

  XDS_ASSIGN_OR_RETURN(PromptCodec codec, PromptCodec::open(a.model, a.chat_template));
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    XDS_ASSIGN_OR_RETURN(prompt, parse_ids(a.prompt_ids));
  } else {
    XDS_ASSIGN_OR_RETURN(prompt, codec.encode_prompt(a.prompt, a.chat));
  }
  const int64_t valid_vocab = codec.valid_vocab(cfg.vocab_size);

  const int64_t total = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  if (total > cfg.max_position_embeddings) {
    return invalid_argument(
        "prompt ({} tokens) + --max-tokens {} exceeds the model's max_position_embeddings {}",
        prompt.size(), a.max_tokens, cfg.max_position_embeddings);
  }
  XDS_ASSIGN_OR_RETURN(KvCache cache, model->make_cache(total + 16));
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

  kernels::SamplingParams sp{a.temperature, a.top_p, a.top_k, a.seed};
  std::vector<std::pair<float, int32_t>> scratch;
  const float* last = out.logits.data() + (out.logits.size() - cfg.vocab_size);
  std::vector<float> row(last, last + cfg.vocab_size);
  int64_t pos = n_prompt;
  int64_t generated = 0;
  const auto t1 = Clock::now();
  while (generated < a.max_tokens) {
    XDS_RETURN_IF_ERROR(check_finite_logits(a.model, pos - 1, row.data(), valid_vocab));
    const int32_t next = kernels::sample_token(row.data(), valid_vocab, sp,
                                               kernels::sampling_uniform(a.seed, pos), scratch);
    ++generated;
    codec.emit(next, generated == 1);
    const bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) !=
                     cfg.eos_token_ids.end();
    if ((eos && !a.ignore_eos) || generated == a.max_tokens) break;
    step_start = pos;
    XDS_ASSIGN_OR_RETURN(const TokenChunk tc,
                         cache.chunk(seq, pos, std::span<const int32_t>(&next, 1)));
    XDS_RETURN_IF_ERROR(model->forward({&tc, 1}, cache.storage(), out));
    XDS_RETURN_IF_ERROR(write_rows(out));
    row.assign(out.logits.begin(), out.logits.begin() + cfg.vocab_size);
    ++pos;
  }
  const double decode_s = seconds_since(t1);
  codec.finish();
  if (logits_file) XDS_RETURN_IF_ERROR(logits_file->commit());
  if (routing_file) {
    model->set_routing_observer(nullptr);
    XDS_RETURN_IF_ERROR(routing_file->commit());
  }
  const int64_t decode_steps = generated - 1;
  std::fprintf(stderr,
               "prefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld tokens in %.3f s "
               "(%.1f tokens/s); compute %s, KV cache %s\n",
               static_cast<long long>(n_prompt), prefill_s, n_prompt / std::max(prefill_s, 1e-9),
               static_cast<long long>(decode_steps), decode_s,
               decode_steps > 0 ? decode_steps / std::max(decode_s, 1e-9) : 0.0,
               a.compute_dtype.c_str(), std::string(dtype_name(model->kv_cache_dtype())).c_str());
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

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
#include "engine/engine_core.h"
#include "engine/sampler.h"
#include "engine/speculative_stage.h"
#include "model/registry.h"

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
  std::string activation_dtype = "auto";
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

void print_stats(const GenerateArgs& a, const std::string& kv_dtype, int64_t n_prompt,
                 double prefill_s, int64_t decode_tokens, double decode_s) {
  std::fprintf(stderr,
               "prefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld tokens in %.3f s "
               "(%.1f tokens/s); compute %s, KV cache %s\n",
               static_cast<long long>(n_prompt), prefill_s, n_prompt / std::max(prefill_s, 1e-9),
               static_cast<long long>(decode_tokens), decode_s,
               decode_tokens > 0 ? decode_tokens / std::max(decode_s, 1e-9) : 0.0,
               a.compute_dtype.c_str(), kv_dtype.c_str());
}

void print_speculative_stats(const engine::SpeculativeStage& spec) {
  const engine::SpecStats& st = spec.stats();
  std::string rates;
  for (size_t i = 0; i < st.accepted.size(); ++i) {
    rates +=
        fmt::format(" {:.3f}", st.drafted[i] > 0 ? double(st.accepted[i]) / st.drafted[i] : 0.0);
  }
  std::fprintf(stderr,
               "speculative: %lld drafts per step from %lld MTP layer(s); %lld steps; acceptance "
               "per draft position:%s; mean tokens per step %.3f\n",
               static_cast<long long>(spec.config().draft_tokens),
               static_cast<long long>(spec.config().layers), static_cast<long long>(st.steps),
               rates.c_str(), st.steps > 0 ? double(st.tokens) / st.steps : 0.0);
}

// --dump-logits and --dump-routing. The files appear whole or not at all: a run that fails
// midway (non-finite logits, a full disk) leaves no truncated file that a comparison script
// could read as complete.
class Dumps {
 public:
  Status open(const GenerateArgs& a) {
    if (!a.dump_logits.empty()) {
      auto f = AtomicFile::create(a.dump_logits);
      if (!f.ok()) return invalid_argument("--dump-logits: {}", f.status().message());
      logits_.emplace(std::move(*f));
    }
    if (!a.dump_routing.empty()) {
      auto f = AtomicFile::create(a.dump_routing);
      if (!f.ok()) return invalid_argument("--dump-routing: {}", f.status().message());
      routing_.emplace(std::move(*f));
    }
    return {};
  }
  bool logits() const { return logits_.has_value(); }

  // The model's routing observer: the experts of the step's token `token` (batch order) in
  // `layer`, kept until the step's chunk says where the token sits.
  void observe(CausalLm& model) {
    if (!routing_) return;
    model.set_routing_observer(
        [this](int64_t layer, int64_t token, std::span<const int32_t> experts) {
          routes_.push_back({layer, token, std::vector<int32_t>(experts.begin(), experts.end())});
        });
  }

  // One sequence: a step runs one chunk; its logits rows are every position's
  // (EngineCoreOptions::all_logits) and the routes' rows are its positions.
  Status write_step(std::span<const TokenChunk> chunks, const StepOutput& out) {
    if (logits_) {
      XDS_RETURN_IF_ERROR(logits_->write(out.logits.data(), out.logits.size() * sizeof(float)));
    }
    if (routing_ && !chunks.empty()) {
      for (const Route& r : routes_) {
        // A failed write is kept by the file and returned by commit().
        (void)routing_->write(fmt::format("{{\"layer\":{},\"row\":{},\"experts\":[{}]}}\n", r.layer,
                                          chunks[0].start_pos + r.token,
                                          fmt::join(r.experts, ",")));
      }
    }
    routes_.clear();
    return {};
  }

  Status commit(CausalLm& model) {
    if (logits_) XDS_RETURN_IF_ERROR(logits_->commit());
    if (routing_) {
      model.set_routing_observer(nullptr);
      XDS_RETURN_IF_ERROR(routing_->commit());
    }
    return {};
  }

 private:
  struct Route {
    int64_t layer = 0, token = 0;
    std::vector<int32_t> experts;
  };
  std::optional<AtomicFile> logits_, routing_;
  std::vector<Route> routes_;
};

// Every logits row of a step is finite, else DataLoss naming the position it predicts from.
Status check_step_logits(const std::string& model, std::span<const TokenChunk> chunks,
                         const StepOutput& out, int64_t vocab, int64_t valid_vocab) {
  int64_t row = 0;
  for (const TokenChunk& c : chunks) {
    const int64_t count = static_cast<int64_t>(c.tokens.size());
    const int64_t rows = c.all_logits ? count : 1;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = c.start_pos + (c.all_logits ? r : count - 1);
      XDS_RETURN_IF_ERROR(
          check_finite_logits(model, position, out.logits.data() + (row + r) * vocab, valid_vocab));
    }
    row += rows;
  }
  return {};
}

// One request through the engine core (engine/engine_core.h): the DP group's request table,
// scheduler, sampler and speculative stage, without sockets, so the tokens are serve's for
// the same request and seed (with --speculative-tokens k too: the acceptance test and the
// residual draw take their own draws, so sampled tokens differ from k = 0's: the same
// distribution, other tokens; greedy output is k = 0's). The text goes through the output
// process's detokenizer (PromptCodec).
Status run_generate(const GenerateArgs& a) {
  if (!(a.top_p > 0.0f)) {  // serve's range: the sampler keeps at least one candidate
    return invalid_argument("--top-p must be greater than 0 and at most 1, got {}", a.top_p);
  }
  engine::EngineCoreOptions o;
  XDS_RETURN_IF_ERROR(parse_dtype_flags(a.compute_dtype, a.kv_cache_dtype, o.model));
  XDS_RETURN_IF_ERROR(parse_attention_flag(a.attention, o.model));
  XDS_RETURN_IF_ERROR(parse_activation_flag(a.activation_dtype, o.model));
  o.model.threads = a.threads;
  XDS_ASSIGN_OR_RETURN(const ModelInfo info, load_model_info(a.model));

  XDS_ASSIGN_OR_RETURN(PromptCodec codec, PromptCodec::open(a.model, a.chat_template));
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    XDS_ASSIGN_OR_RETURN(prompt, parse_ids(a.prompt_ids));
  } else {
    XDS_ASSIGN_OR_RETURN(prompt, codec.encode_prompt(a.prompt, a.chat));
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t total = n_prompt + a.max_tokens;
  if (total > info.max_position_embeddings) {
    return invalid_argument(
        "prompt ({} tokens) + --max-tokens {} exceeds the model's max_position_embeddings {}",
        prompt.size(), a.max_tokens, info.max_position_embeddings);
  }
  XDS_RETURN_IF_ERROR(check_speculative_flags(a.speculative, a.model));
  Dumps dumps;
  if (a.speculative.tokens > 0 && (!a.dump_logits.empty() || !a.dump_routing.empty())) {
    return invalid_argument(
        "--dump-logits and --dump-routing write one row per position of a plain run; they "
        "cannot be combined with --speculative-tokens");
  }
  XDS_RETURN_IF_ERROR(dumps.open(a));

  // One sequence: steps of one prefill chunk (--prefill-chunk, or the whole prompt), then
  // one decode (1 + k tokens with k drafts) each.
  const int64_t k = a.speculative.tokens;
  o.model_dir = a.model;
  o.max_num_seqs = 1;
  o.max_num_batched_tokens = std::max(a.prefill_chunk > 0 ? a.prefill_chunk : n_prompt, k + 1);
  o.prefix_cache = false;
  o.kv_tokens = total + k + 16;
  o.valid_vocab = codec.valid_vocab(info.vocab_size);
  o.speculative_tokens = k;
  o.speculative_mtp_layers = a.speculative.mtp_layers;
  o.all_logits = dumps.logits();
  o.after_forward = [&](std::span<const TokenChunk> chunks, const StepOutput& out) -> Status {
    XDS_RETURN_IF_ERROR(check_step_logits(a.model, chunks, out, info.vocab_size, o.valid_vocab));
    return dumps.write_step(chunks, out);
  };
  XDS_ASSIGN_OR_RETURN(std::unique_ptr<engine::EngineCore> core, engine::EngineCore::create(o));
  dumps.observe(core->model());

  engine::EngineRequest r;
  r.id = "generate";
  r.prompt = prompt;
  r.sampling = sampling_options(a);
  XDS_RETURN_IF_ERROR(core->add_request(std::move(r)));

  std::vector<engine::TokenDelta> deltas;
  int64_t generated = 0;
  double prefill_s = 0.0;
  bool finished = false;
  const auto t0 = Clock::now();
  auto t1 = t0;
  while (!finished && core->has_work()) {
    deltas.clear();
    XDS_RETURN_IF_ERROR(core->step(&deltas));
    for (const engine::TokenDelta& d : deltas) {
      if (generated == 0 && !d.tokens.empty()) {
        prefill_s = seconds_since(t0);  // the prompt's steps and the first token's draw
        t1 = Clock::now();
      }
      generated += static_cast<int64_t>(d.tokens.size());
      codec.emit(d);
      finished = finished || !d.finish_reason.empty();
    }
  }
  const double decode_s = seconds_since(t1);
  codec.finish();
  XDS_RETURN_IF_ERROR(dumps.commit(core->model()));
  if (core->speculative() != nullptr) print_speculative_stats(*core->speculative());
  print_stats(a, kv_cache_dtype_name(core->model()), n_prompt, prefill_s,
              std::max<int64_t>(generated - 1, 0), decode_s);
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
  cmd->add_option("--activation-dtype", args->activation_dtype, kActivationDTypeHelp);
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

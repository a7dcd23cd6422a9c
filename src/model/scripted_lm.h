// ScriptedLm: a test model whose greedy output is a known script of token ids
// (model_type "xds_scripted"). It serves the end-to-end tests of what sits above the model
// (the gateway, the reasoning and tool-call parsers, the OpenAI API) with outputs written in
// the test, and it is the second architecture behind CausalLm: one file plus one row in
// registry.cc's table.
//
// config.json (keys mapped in one table in scripted_lm.cc):
//   model_type               "xds_scripted"
//   vocab_size               integer >= 1
//   max_position_embeddings  integer >= 1
//   script_token_ids         non-empty list of ids in [0, vocab_size)
//   eos_token_id, bos_token_id  optional (generation_config.json's, if present, win)
//
// What it computes: the logits after a context c[0..p] (one row per position that needs
// logits) are kScriptedLogit on one id and 0 on every other. With script s[0..S) and
// i = the length of the longest suffix of c[0..p] that equals a prefix of s (0 <= i <= S):
//   i < S:  s[i]
//   i == S: the first eos id (none given: s[0], the script starts again)
// So a prompt that does not end inside the script gets s[0], s[1], ..., s[S-1], eos.
//
// The KV cache is one layer of one plane, one int32 per position: the token id written
// there (kv_layout()). forward() writes each chunk's tokens through its block table, then
// reads each logit row's context back from the cache through the same table: what a row
// sees is what the cache holds, so the model is stateless between calls and its output is
// correct under batching, chunked prefill, prefix-cache hits, preemption and forks exactly
// when the engine's block tables are. No MoE layers, no MTP layers.
//
// Thread-safety: one step at a time (scratch buffers); the setters between steps. ModelOptions
// are accepted and change nothing but compute_dtype()'s answer (the pool is the calling
// thread alone: there is nothing to split).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/causal_lm.h"

namespace xds {

inline constexpr float kScriptedLogit = 20.0f;  // the chosen id's logit; the rest are 0

struct ScriptedLmConfig {
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> script;         // script_token_ids
  std::vector<int64_t> eos_token_ids;  // generation_config.json, else config.json
  std::optional<int64_t> bos_token_id;
};

// Parses config.json text (`source` names it in errors: the file, the field, what was
// expected and what was found).
Result<ScriptedLmConfig> parse_scripted_lm_config(const std::string& json_text,
                                                  const std::string& source);
// Reads dir/config.json and, if present, dir/generation_config.json (eos and bos ids).
Result<ScriptedLmConfig> load_scripted_lm_config(const std::string& dir);

class ScriptedLm final : public CausalLm {
 public:
  static Result<std::unique_ptr<ScriptedLm>> load(const std::string& dir,
                                                  const ModelOptions& options);
  // The ModelInfo that load() would give, from the config files alone.
  static Result<ModelInfo> load_info(const std::string& dir);
  // A model from a config in memory; `name` is ModelInfo::name. InvalidArgument when the
  // config breaks a rule above.
  static Result<std::unique_ptr<ScriptedLm>> create(const ScriptedLmConfig& config,
                                                    const std::string& name);

  const ScriptedLmConfig& config() const { return config_; }
  // The id the model picks after `context` (the rule above; the whole context, or any
  // suffix of it at least script-long, gives the same id).
  int32_t next_token(std::span<const int32_t> context) const;

  // CausalLm
  const ModelInfo& info() const override { return info_; }
  ComputeDType compute_dtype() const override { return compute_; }
  KvLayout kv_layout() const override;
  Status forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) override;
  // There are no MTP layers: always InvalidArgument naming k.
  Status forward_mtp(int64_t k, std::span<const MtpChunk> chunks, KvStorage& kv,
                     StepOutput& out) override;
  void set_moe_exchange(MoeExchange*) override {}  // no MoE layers: nothing to replace
  void set_routing_observer(RoutingObserver observer) override {
    routing_observer_ = std::move(observer);  // kept, never called: nothing is routed
  }
  std::span<const int64_t> routed_token_counts() const override { return {}; }
  const MoeWeights* moe_weights(int64_t) const override { return nullptr; }
  ThreadPool& pool() override { return pool_; }

 private:
  explicit ScriptedLm(const ScriptedLmConfig& config);
  Status check_storage(const KvStorage& kv) const;
  Status check_chunk(size_t index, const TokenChunk& chunk, const KvStorage& kv) const;
  // The length (0..S) of the longest suffix of `context` that is a prefix of the script.
  int64_t state_after(std::span<const int32_t> context) const;

  ScriptedLmConfig config_;
  ModelInfo info_;
  ComputeDType compute_ = ComputeDType::kF32;
  // fail_[k] for k in [0, S): the longest proper prefix of script[0..k] that is also its
  // suffix (the Knuth-Morris-Pratt failure table). [S]
  std::vector<int32_t> fail_;
  RoutingObserver routing_observer_;
  ThreadPool pool_{1};
  std::vector<int32_t> s_context_;  // scratch: one row's context window [<= S]
};

}  // namespace xds

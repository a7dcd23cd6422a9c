// A one-sequence MTP speculative decoding loop over the bookkeeping of
// model/speculative_decode.h, with a pluggable acceptance rule, for tests: a scripted rule
// drives rollback through every accepted count, and the loop's output is checked against
// plain decoding and drafts computed from scratch. Production decoding runs the engine's
// speculative stage (engine/speculative_stage.h; `generate` and `serve` alike).
//
// Thread-safety: not thread-safe (it steps a model).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/causal_lm.h"
#include "model/kv_cache.h"
#include "model/speculative_decode.h"

namespace xds::mtp_reference {

// How many of an accepted run to emit: up to and including the first id of `stop_ids`, and
// at most `remaining` (>= 0) tokens.
struct MtpSpecCut {
  int64_t count = 0;
  bool stopped = false;  // a stop id ends the run (it is emitted)
  bool length = false;   // `remaining` ends it
};
MtpSpecCut mtp_spec_cut(std::span<const int32_t> tokens, std::span<const int32_t> stop_ids,
                        int64_t remaining);

// What the acceptance rule of one request sees (engine::speculative_accept with the
// request's sampling options decides): the main model's rows at the verified positions.
struct MtpSpecRows {
  const float* logits = nullptr;    // [drafts.size() + 1, vocab]; row r predicts position + r
  std::span<const int32_t> drafts;  // d_1 .. d_n
  int64_t position = 0;             // position of the token row 0 predicts
  std::span<const int32_t> output;  // tokens generated before (penalties)
};
// Appends the accepted drafts then the next token to `tokens`. With no drafts it is the
// ordinary sampling of one token.
using MtpSpecAcceptFn =
    std::function<Status(const MtpSpecRows& rows, std::vector<int32_t>& tokens)>;

struct MtpSpecDecodeOptions {
  MtpSpecConfig spec;
  int64_t max_tokens = 64;        // tokens to generate, >= 1
  std::vector<int32_t> stop_ids;  // generation ends after one of these (EOS, unless ignored)
  int64_t max_length = 0;         // positions the model may run (max_position_embeddings)
  int64_t valid_vocab = 0;        // drafts never propose an id at or past it
  int64_t prefill_chunk = 0;      // prefill in chunks of this many tokens (0: one chunk)
};

struct MtpSpecStats {
  int64_t steps = 0;                 // verify steps
  std::vector<int64_t> verified_at;  // [k] steps that verified a draft at position i + 1
  std::vector<int64_t> accepted_at;  // [k] steps that accepted it
  int64_t step_tokens = 0;           // tokens the acceptance rule gave over the steps
};

// One sequence decoded speculatively over a KvCache (batch of one). Prefill, then steps until
// finished(); each step emits 1 .. k+1 tokens.
class MtpSpecDecoder {
 public:
  // `model`, `cache` and `accept` must outlive the decoder; `seq` is a fresh slot of `cache`.
  MtpSpecDecoder(CausalLm& model, KvCache& cache, int64_t seq, MtpSpecDecodeOptions options,
                 MtpSpecAcceptFn accept);

  // Runs the prompt (>= 1 token), samples the first token, and proposes the first drafts.
  Status prefill(std::span<const int32_t> prompt);
  // verify() then, unless finished, propose().
  Status step();
  // The halves of a step: the main model over [x_L, drafts], the acceptance, the cut at a
  // stop id or max_tokens, the commit and the rollback of the KV past the accepted length.
  Status verify();
  // The MTP passes that give the next step's drafts.
  Status propose();

  bool finished() const { return finished_; }
  std::span<const int32_t> tokens() const { return tokens_; }  // prompt + output
  std::span<const int32_t> output() const;
  std::span<const int32_t> last_emitted() const;  // what the last prefill/step added
  const MtpSpecState& state() const { return state_; }
  const MtpSpecStats& stats() const { return stats_; }
  // The main model's verify rows of the last step: [drafts + 1, vocab].
  std::span<const float> verify_logits() const { return main_out_.logits; }
  // The MTP logits each draft of the last propose came from: [drafts, vocab].
  std::span<const float> draft_logits() const { return draft_logits_; }

 private:
  Status emit(std::span<const int32_t> run);
  int64_t passes_wanted() const;

  CausalLm& model_;
  KvCache& cache_;
  int64_t seq_;
  MtpSpecDecodeOptions opt_;
  MtpSpecAcceptFn accept_;
  MtpSpecState state_;
  MtpSpecStats stats_;
  std::vector<int32_t> tokens_;  // x_0 .. x_L
  int64_t prompt_len_ = 0;
  int64_t emitted_from_ = 0;  // tokens_ index of the last emitted run
  bool finished_ = false;
  StepOutput main_out_, mtp_out_;
  std::vector<int32_t> verify_, run_;
  std::vector<float> draft_logits_;  // [drafts, vocab]
};

}  // namespace xds::mtp_reference

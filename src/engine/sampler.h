// Per-request token sampling (docs/design/flowserve.md, "The DP group's step", step 5).
//
// The draws come from a counter-based generator: sample_uniform(seed, position, draw) is a
// stateless hash of its three arguments, so a request's tokens depend only on its own seed,
// the position being sampled and the draw index (0 for the ordinary sample; MTP's acceptance
// test and residual draws use further indices at the same position), never on what else is
// in the batch or on the order of calls.
//
// Processing, in vLLM's order, over logits[0, valid_vocab) (ids >= valid_vocab never win):
//   1. repetition penalty r (HF): for every id seen in the prompt or the output so far,
//      logit > 0 ? logit / r : logit * r;
//   2. frequency f and presence p penalties (OpenAI), from the output counts c:
//      logit -= f * c + p * (c > 0);
//   3. temperature T: 0 is greedy (argmax, ties -> lower id; the penalties still apply);
//      otherwise logit / T;
//   4. top-k (0: off): the k best by (logit desc, id asc);
//   5. top-p: the shortest prefix of the kept tokens, best first, whose probability reaches
//      top_p; then renormalised.
// The draw u in [0, 1) picks by inverse CDF over the kept candidates.
//
// Logprobs are of the model's raw distribution (log_softmax of the unprocessed row, as vLLM
// returns by default): the chosen token's and the top k (desc, ties -> lower id).
//
// Thread-safety: a Sampler is not thread-safe (it owns scratch); use one per thread.
// Memory: the scratch grows to the largest valid_vocab seen and is reused, so warm calls do
// not allocate (TokenLogprob::top is cleared and refilled, keeping its capacity).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "protocol/payloads.h"

namespace xds::engine {

// A uniform double in [0, 1) from (seed, position, draw): 53 bits of a splitmix64-style
// chain over the three values. Pure; equal arguments give equal draws.
double sample_uniform(uint64_t seed, int64_t position, uint32_t draw);

struct SampleInput {
  const float* logits = nullptr;  // [valid_vocab] (a row of [tokens, vocab]; only the first
                                  // valid_vocab entries are read)
  int64_t valid_vocab = 0;        // > 0
  const SamplingOptions* options = nullptr;
  std::span<const int32_t> prompt = {};  // the request's prompt ids (repetition penalty only)
  std::span<const int32_t> output = {};  // ids generated so far (all three penalties)
  int64_t position = 0;  // position of the token being sampled (the counter's position)
  uint32_t draw = 0;     // draw index at that position
};

// One kept candidate after processing: its id and unnormalised weight.
struct SampleCandidate {
  int32_t id = 0;
  double weight = 0.0;
};

class Sampler {
 public:
  Sampler() = default;

  // Processes the row (steps 1-5 above) and draws the token with
  // u = sample_uniform(seed, position, draw). With logprobs != nullptr and
  // options->logprobs >= 0, fills *logprobs (token, its raw logprob, and the top
  // options->logprobs raw entries). InvalidArgument on a null pointer, valid_vocab <= 0,
  // options out of range (temperature < 0 or not finite, top_p outside (0, 1], top_k < 0,
  // repetition_penalty <= 0), a NaN or +inf logit, or a row without a finite logit. Ids
  // outside [0, valid_vocab) in prompt/output have no logit and are ignored.
  Result<int32_t> sample(const SampleInput& in, TokenLogprob* logprobs);

  // The processing alone (no draw): afterwards candidates() holds the kept tokens and
  // pick()/probability() read them. Same errors as sample().
  Status prepare(const SampleInput& in);
  // The kept candidates of the last prepare(): greedy -> one; top-k / top-p -> best first;
  // otherwise every id with a non-zero weight, in id order.
  std::span<const SampleCandidate> candidates() const { return {cand_.data(), n_cand_}; }
  // The token at u in [0, 1) by inverse CDF over candidates().
  int32_t pick(double u) const;
  // Same, with `excluded` removed and the rest renormalised (MTP's residual draw); if
  // `excluded` holds all the mass, returns it.
  int32_t pick_excluding(int32_t excluded, double u) const;
  // The processed probability of `id` (0 when it was cut).
  double probability(int32_t id) const;

  // log_softmax of the raw row: fills *out with `token`'s logprob and the top k entries.
  // Same validation of the row as sample().
  Status raw_logprobs(const float* logits, int64_t valid_vocab, int32_t token, int32_t k,
                      TokenLogprob* out);

 private:
  Status check_row(const float* logits, int64_t valid_vocab) const;
  void apply_penalties(const SampleInput& in);
  void keep_top(int64_t k, double top_p, double temperature);

  std::vector<float> work_;            // [valid_vocab] penalised logits
  std::vector<int32_t> counts_;        // [vocab] output counts, zero between calls
  std::vector<uint8_t> seen_;          // [vocab] prompt-or-output flags, zero between calls
  std::vector<int32_t> touched_;       // ids whose counts_/seen_ were set
  std::vector<int32_t> order_;         // [valid_vocab] ids, partially sorted
  std::vector<SampleCandidate> cand_;  // [valid_vocab] capacity; first n_cand_ valid
  size_t n_cand_ = 0;
  double total_ = 0.0;  // sum of the candidates' weights
};

}  // namespace xds::engine

// The acceptance rule of MTP speculative decoding (P080-P083) for one request: a pure
// function of the main model's verify rows, the drafts and the request's sampling options
// (docs/design/flowserve.md, "The DP group's step"; the bookkeeping around it is
// model/speculative_decode.h).
//
// Row r of the verify chunk predicts the token at position `position + r`, after the drafts
// d_1 .. d_r. Each row is processed exactly as the sampler processes a row (Sampler::prepare:
// penalties over the output so far plus the drafts accepted before it, temperature, top-k, top-p),
// giving the distribution p_r. The drafts are one-hot proposals (the MTP head's argmax), so
// the rule that keeps the output distribution that of sampling p_r is:
//   for r = 0 .. n-1:  accept d_{r+1} with probability p_r(d_{r+1}):
//                        u = sample_uniform(seed, position + r, kSpecDrawAccept) < p_r(d);
//                      else emit a token from p_r with d_{r+1} removed and renormalised
//                        (Sampler::pick_excluding with draw kSpecDrawResidual) and stop;
//   all n accepted:    emit a token from p_n with the ordinary draw (draw 0) at its position.
// Temperature 0 makes p_r one-hot on the argmax: drafts are accepted while they equal it, and
// the token after them is the argmax of the first row that disagrees (or of row n). With no
// drafts the rule is the sampler's ordinary sample. The draws are keyed by (seed, position,
// draw) only, so equal keys give equal results whatever the batch.
//
// Thread-safety: uses the caller's Sampler (not thread-safe); one per thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "protocol/payloads.h"
#include "engine/sampler.h"

namespace xds::engine {

// Draw indices at a verified position (the ordinary sample uses draw 0).
inline constexpr uint32_t kSpecDrawAccept = 1;
inline constexpr uint32_t kSpecDrawResidual = 2;

struct SpecVerifyInput {
  const float* logits = nullptr;    // [drafts.size() + 1, row_stride] the main model's rows
  int64_t row_stride = 0;           // elements per row (the model's vocabulary)
  int64_t valid_vocab = 0;          // ids that can win: [0, valid_vocab), <= row_stride
  std::span<const int32_t> drafts;  // [n] d_1 .. d_n
  const SamplingOptions* options = nullptr;
  std::span<const int32_t> prompt = {};  // the request's prompt (repetition penalty)
  std::span<const int32_t> output = {};  // tokens generated before this step (penalties)
  int64_t position = 0;                  // position of the token row 0 predicts
};

struct SpecVerifyResult {
  int64_t accepted = 0;          // drafts accepted, 0 .. n
  std::vector<int32_t> tokens;   // [accepted + 1]: the accepted drafts, then the next token
  std::vector<int32_t> history;  // scratch: output plus the drafts accepted so far
};

// The rule above. InvalidArgument as Sampler::prepare (bad options, a null or non-finite
// row), or a row stride below valid_vocab, or a draft outside [0, valid_vocab).
Status speculative_accept(Sampler& sampler, const SpecVerifyInput& in, SpecVerifyResult& out);

}  // namespace xds::engine

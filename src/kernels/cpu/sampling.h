// Token sampling from one row of logits.
//
// Only ids < valid_vocab can win (lm_head rows beyond the tokenizer's vocabulary never do).
// temperature == 0: greedy argmax (ties: lower id). Otherwise softmax(logits / T) restricted
// to the top_k best (0: all) and then to the smallest prefix whose probability reaches top_p,
// renormalised; the draw u in [0, 1) comes from the caller (seeded per request and position,
// so a step can be replayed).
#pragma once

#include <cstdint>
#include <vector>

namespace xds::kernels {

struct SamplingParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
};

// A uniform draw in [0, 1) from (seed, position): splitmix64 of their mix.
double sampling_uniform(uint64_t seed, int64_t position);

// scratch is resized as needed and reused across calls.
int32_t sample_token(const float* logits, int64_t valid_vocab, const SamplingParams& p, double u,
                     std::vector<std::pair<float, int32_t>>& scratch);

}  // namespace xds::kernels

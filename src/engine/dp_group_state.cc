#include "engine/dp_group_state.h"

#include <algorithm>

namespace xds::engine {

uint64_t choice_seed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  // splitmix64 of (seed, index): distinct, well-mixed streams per choice.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string finish_reason_after(const Sequence& s, int32_t token,
                                const std::vector<int32_t>& eos_ids, int64_t max_model_len) {
  const SamplingOptions& o = s.request->req.sampling;
  const bool eos = std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
  if (eos && !o.ignore_eos) return "stop";
  if (std::find(o.stop_token_ids.begin(), o.stop_token_ids.end(), token) !=
      o.stop_token_ids.end()) {
    return "stop";
  }
  if (s.output_len() >= o.max_tokens) return "length";
  if (max_model_len > 0 && static_cast<int64_t>(s.tokens.size()) >= max_model_len) return "length";
  return "";
}

}  // namespace xds::engine

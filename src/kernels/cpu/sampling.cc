#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>

namespace xds::kernels {

double sampling_uniform(uint64_t seed, int64_t position) {
  uint64_t z =
      seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(position) + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t sample_token(const float* logits, int64_t valid_vocab, const SamplingParams& p, double u,
                     std::vector<std::pair<float, int32_t>>& scratch) {
  // NaN ranks below every number (as -inf), so the orderings below stay strict weak
  // orderings (std::sort with NaN compared as is has undefined behaviour). Logits with no
  // finite maximum (+inf, or all NaN) still return a valid id, not a meaningful one:
  // callers check the logits first (generate does).
  auto rank = [](float v) { return std::isnan(v) ? -INFINITY : v; };
  if (p.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t i = 1; i < valid_vocab; ++i) {
      if (rank(logits[i]) > rank(logits[best])) best = i;
    }
    return static_cast<int32_t>(best);
  }
  // Candidates ordered by logit descending, ties by lower id.
  scratch.clear();
  for (int64_t i = 0; i < valid_vocab; ++i)
    scratch.emplace_back(rank(logits[i]), static_cast<int32_t>(i));
  auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int64_t keep = valid_vocab;
  if (p.top_k > 0 && p.top_k < valid_vocab) {
    keep = p.top_k;
    std::partial_sort(scratch.begin(), scratch.begin() + keep, scratch.end(), better);
  } else {
    std::sort(scratch.begin(), scratch.end(), better);
  }
  // Softmax over the kept candidates (in double), then the top-p prefix.
  const double mx = scratch[0].first;
  std::vector<double> prob(static_cast<size_t>(keep));
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i)
    sum += prob[i] = std::exp((scratch[i].first - mx) / p.temperature);
  int64_t cut = keep;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += prob[i] / sum;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  double total = 0.0;
  for (int64_t i = 0; i < cut; ++i) total += prob[i];
  double target = u * total;
  for (int64_t i = 0; i < cut; ++i) {
    target -= prob[i];
    if (target < 0.0) return scratch[i].second;
  }
  return scratch[cut - 1].second;
}

}  // namespace xds::kernels

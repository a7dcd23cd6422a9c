#include "mkmodel/router_skew.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <random>
#include <string>

namespace xds {
namespace {

constexpr double kMaxZipfA = 8.0;

// Uniform in [0, 1) from the top 53 bits.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

// A standard normal (Box-Muller, the cosine branch).
double normal(std::mt19937_64& rng) {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1]: log stays finite
  const double u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace

Result<double> parse_router_skew(std::string_view text) {
  constexpr std::string_view kPrefix = "zipf:";
  double a = 0;
  bool ok = text.substr(0, kPrefix.size()) == kPrefix;
  if (ok) {
    const std::string_view num = text.substr(kPrefix.size());
    const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), a);
    ok = !num.empty() && ec == std::errc() && end == num.data() + num.size() && std::isfinite(a) &&
         a > 0 && a <= kMaxZipfA;
  }
  if (!ok) {
    return invalid_argument(
        "mkmodel: --router-skew '{}': expected zipf:A with A a number in (0, {}]", text, kMaxZipfA);
  }
  return a;
}

std::vector<int32_t> router_skew_permutation(uint64_t seed, int64_t layer, int64_t n_experts) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(layer), static_cast<uint32_t>(layer >> 32)};
  std::mt19937_64 rng(seq);
  std::vector<int32_t> perm(static_cast<size_t>(n_experts));
  for (int64_t i = 0; i < n_experts; ++i) perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = n_experts - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

std::vector<double> router_skew_targets(std::span<const int32_t> perm, double zipf_a,
                                        int64_t top_k) {
  const size_t n = perm.size();
  std::vector<double> by_rank(n);  // [n] the rate of rank r
  std::vector<bool> capped(n, false);
  // Water-filling: the uncapped ranks share what the capped ones leave, in proportion.
  for (;;) {
    double weight = 0;
    size_t n_capped = 0;
    for (size_t r = 0; r < n; ++r) {
      if (capped[r]) {
        ++n_capped;
      } else {
        weight += std::pow(static_cast<double>(r + 1), -zipf_a);
      }
    }
    const double left = static_cast<double>(top_k) - static_cast<double>(n_capped);
    bool again = false;
    for (size_t r = 0; r < n; ++r) {
      by_rank[r] = capped[r] ? 1.0 : left * std::pow(static_cast<double>(r + 1), -zipf_a) / weight;
      if (!capped[r] && by_rank[r] > 1.0) {
        capped[r] = true;
        again = true;
      }
    }
    if (!again || left <= 0) break;
  }
  std::vector<double> q(n);
  for (size_t r = 0; r < n; ++r) q[static_cast<size_t>(perm[r])] = std::min(1.0, by_rank[r]);
  return q;
}

std::vector<float> router_skew_fit_bias(const GatingParams& p, std::span<const float> logits,
                                        std::span<const double> targets) {
  const int64_t e = p.num_experts;
  const int64_t n_tokens = static_cast<int64_t>(logits.size()) / e;
  XDS_CHECK(static_cast<int64_t>(targets.size()) == e && n_tokens > 0,
            "router_skew_fit_bias: {} targets, {} logits for {} experts", targets.size(),
            logits.size(), e);
  std::vector<float> bias(static_cast<size_t>(e), 0.0f);     // [e]
  std::vector<double> rate(static_cast<size_t>(e));          // [e] chosen per token
  std::vector<int32_t> ids(static_cast<size_t>(p.top_k));    // [top_k]
  std::vector<float> weights(static_cast<size_t>(p.top_k));  // [top_k]
  std::vector<float> scratch(static_cast<size_t>(2 * e));    // [2 * e]
  const double floor = 0.5 / static_cast<double>(n_tokens);  // an expert never chosen
  for (int round = 0; round < kRouterSkewFitRounds; ++round) {
    std::fill(rate.begin(), rate.end(), 0.0);
    for (int64_t t = 0; t < n_tokens; ++t) {
      route_token(p, logits.data() + t * e, bias.data(), ids.data(), weights.data(),
                  scratch.data());
      for (const int32_t id : ids) rate[static_cast<size_t>(id)] += 1.0;
    }
    double mean = 0;
    std::vector<double> next(static_cast<size_t>(e));  // [e]
    for (int64_t i = 0; i < e; ++i) {
      const size_t k = static_cast<size_t>(i);
      const double f = std::max(rate[k] / static_cast<double>(n_tokens), floor);
      next[k] = bias[k] + kRouterSkewFitStep * (std::log(targets[k]) - std::log(f));
      mean += next[k] / static_cast<double>(e);
    }
    for (int64_t i = 0; i < e; ++i) {
      const size_t k = static_cast<size_t>(i);
      bias[k] = static_cast<float>(
          std::clamp(next[k] - mean, -kRouterSkewBiasLimit, kRouterSkewBiasLimit));
    }
  }
  return bias;
}

std::vector<float> router_skew_bias(const GatingParams& p, std::span<const float> gate,
                                    int64_t hidden, const RouterSkew& skew, int64_t layer) {
  const int64_t e = p.num_experts;
  XDS_CHECK(static_cast<int64_t>(gate.size()) == e * hidden, "router_skew_bias: gate {} != {} x {}",
            gate.size(), e, hidden);
  std::vector<float> gate_t(gate.size());  // [hidden, e]: the inner loop over e vectorizes
  for (int64_t i = 0; i < e; ++i) {
    for (int64_t j = 0; j < hidden; ++j)
      gate_t[static_cast<size_t>(j * e + i)] = gate[static_cast<size_t>(i * hidden + j)];
  }
  // The hidden states' own stream, apart from the permutation's.
  std::seed_seq seq{static_cast<uint32_t>(skew.seed), static_cast<uint32_t>(skew.seed >> 32),
                    static_cast<uint32_t>(layer), 0x78647321u};
  std::mt19937_64 rng(seq);
  std::vector<float> logits(static_cast<size_t>(kRouterSkewTokens * e), 0.0f);  // [tokens, e]
  std::vector<float> x(static_cast<size_t>(hidden));                            // [hidden]
  for (int64_t t = 0; t < kRouterSkewTokens; ++t) {
    for (float& v : x) v = static_cast<float>(normal(rng));
    float* out = logits.data() + t * e;
    for (int64_t j = 0; j < hidden; ++j) {
      const float xj = x[static_cast<size_t>(j)];
      const float* w = gate_t.data() + j * e;
      for (int64_t i = 0; i < e; ++i) out[i] += w[i] * xj;
    }
  }
  const std::vector<int32_t> perm = router_skew_permutation(skew.seed, layer, e);
  const std::vector<double> targets = router_skew_targets(perm, skew.zipf_a, p.top_k);
  return router_skew_fit_bias(p, logits, targets);
}

}  // namespace xds

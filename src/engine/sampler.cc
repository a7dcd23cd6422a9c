#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace xds::engine {

namespace {

// splitmix64's finaliser: a bijection on 64 bits with full avalanche.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Status check_options(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0.0f)
    return invalid_argument("sampling: temperature must be finite and >= 0, got {}", o.temperature);
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    return invalid_argument("sampling: top_p must be in (0, 1], got {}", o.top_p);
  if (o.top_k < 0) return invalid_argument("sampling: top_k must be >= 0, got {}", o.top_k);
  if (!std::isfinite(o.repetition_penalty) || o.repetition_penalty <= 0.0f)
    return invalid_argument("sampling: repetition_penalty must be finite and > 0, got {}",
                            o.repetition_penalty);
  if (!std::isfinite(o.presence_penalty) || !std::isfinite(o.frequency_penalty))
    return invalid_argument("sampling: presence/frequency penalties must be finite, got {} / {}",
                            o.presence_penalty, o.frequency_penalty);
  if (o.logprobs < -1)
    return invalid_argument("sampling: logprobs must be >= -1, got {}", o.logprobs);
  return {};
}

}  // namespace

double sample_uniform(uint64_t seed, int64_t position, uint32_t draw) {
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
  h = mix64(h ^ (static_cast<uint64_t>(position) * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
  h = mix64(h ^ (static_cast<uint64_t>(draw) * 0x8cb92ba72f3d8dd7ull + 0x2545f4914f6cdd1dull));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

Status Sampler::check_row(const float* logits, int64_t valid_vocab) const {
  if (logits == nullptr) return invalid_argument("sampling: logits row is null");
  if (valid_vocab <= 0 || valid_vocab > INT32_MAX)
    return invalid_argument("sampling: valid_vocab must be in [1, 2^31), got {}", valid_vocab);
  bool any_finite = false;
  for (int64_t i = 0; i < valid_vocab; ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == INFINITY)
      return invalid_argument("sampling: logit of token {} is {}", i, v);
    any_finite |= std::isfinite(v);
  }
  if (!any_finite) return invalid_argument("sampling: no finite logit in {} tokens", valid_vocab);
  return {};
}

void Sampler::apply_penalties(const SampleInput& in) {
  const SamplingOptions& o = *in.options;
  const bool rep = o.repetition_penalty != 1.0f;
  if (!rep && o.frequency_penalty == 0.0f && o.presence_penalty == 0.0f) return;
  const auto vocab = static_cast<size_t>(in.valid_vocab);
  if (counts_.size() < vocab) {
    counts_.resize(vocab, 0);
    seen_.resize(vocab, 0);
  }
  touched_.clear();
  auto touch = [&](int32_t id) {
    if (seen_[id] == 0) {
      seen_[id] = 1;
      touched_.push_back(id);
    }
  };
  for (int32_t id : in.output) {
    if (id < 0 || id >= in.valid_vocab) continue;
    touch(id);
    ++counts_[id];
  }
  if (rep) {
    for (int32_t id : in.prompt) {
      if (id >= 0 && id < in.valid_vocab) touch(id);
    }
  }
  const float r = o.repetition_penalty;
  for (int32_t id : touched_) {
    float l = work_[id];
    if (rep) l = l > 0.0f ? l / r : l * r;
    const int32_t c = counts_[id];
    l -= o.frequency_penalty * static_cast<float>(c) + (c > 0 ? o.presence_penalty : 0.0f);
    work_[id] = l;
    counts_[id] = 0;
    seen_[id] = 0;
  }
}

// Fills cand_ from work_ (temperature > 0): weights exp((l - max) / T), cut by top-k/top-p.
void Sampler::keep_top(int64_t k, double top_p, double temperature) {
  const int64_t v = static_cast<int64_t>(work_.size());
  const float* w = work_.data();
  const double mx = *std::max_element(work_.begin(), work_.end());
  auto weight = [&](int32_t id) {
    return std::exp((static_cast<double>(w[id]) - mx) / temperature);
  };
  auto better = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  if (k <= 0 || k > v) k = v;
  n_cand_ = 0;
  total_ = 0.0;
  if (k == v && top_p >= 1.0) {  // the whole row, in id order
    for (int32_t id = 0; id < v; ++id) {
      const double x = weight(id);
      if (x > 0.0) {
        cand_[n_cand_++] = {id, x};
        total_ += x;
      }
    }
    return;
  }
  order_.resize(static_cast<size_t>(v));
  std::iota(order_.begin(), order_.end(), 0);
  // The normaliser of the top-k set (top-p's reference mass).
  double z = 0.0;
  int64_t sorted = 0;  // order_[0, sorted) is the best `sorted` ids, best first
  if (k < v) {
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), better);
    sorted = k;
    for (int64_t i = 0; i < k; ++i) z += weight(order_[i]);
  } else {
    for (int32_t id = 0; id < v; ++id) z += weight(id);
  }
  // The shortest best-first prefix whose mass reaches top_p (all k when top_p == 1). Without
  // top-k the prefix is sorted in growing windows: top-p usually stops early.
  int64_t cut = k;
  if (top_p < 1.0) {
    double cum = 0.0;
    int64_t i = 0;
    int64_t window = std::min<int64_t>(k, 64);
    cut = -1;
    while (cut < 0) {
      if (sorted < window) {
        std::partial_sort(order_.begin() + sorted, order_.begin() + window, order_.end(), better);
        sorted = window;
      }
      for (; i < window; ++i) {
        cum += weight(order_[i]);
        if (cum >= top_p * z) {
          cut = i + 1;
          break;
        }
      }
      if (cut < 0 && window == k) cut = k;  // rounding: keep everything
      window = std::min(k, window * 8);
    }
  }
  for (int64_t i = 0; i < cut; ++i) {
    const double x = weight(order_[i]);
    cand_[n_cand_++] = {order_[i], x};
    total_ += x;
  }
}

Status Sampler::prepare(const SampleInput& in) {
  if (in.options == nullptr) return invalid_argument("sampling: options are null");
  XDS_RETURN_IF_ERROR(check_options(*in.options));
  XDS_RETURN_IF_ERROR(check_row(in.logits, in.valid_vocab));
  const auto vocab = static_cast<size_t>(in.valid_vocab);
  work_.assign(in.logits, in.logits + vocab);
  if (cand_.size() < vocab) cand_.resize(vocab);
  apply_penalties(in);
  const float mx = *std::max_element(work_.begin(), work_.end());
  if (!std::isfinite(mx)) {
    return invalid_argument(
        "sampling: penalised logits have no finite maximum ({}); "
        "repetition_penalty {} overflows",
        mx, in.options->repetition_penalty);
  }
  if (in.options->temperature == 0.0f) {  // greedy: the first maximum is the lowest id
    const auto best = std::max_element(work_.begin(), work_.end()) - work_.begin();
    cand_[0] = {static_cast<int32_t>(best), 1.0};
    n_cand_ = 1;
    total_ = 1.0;
    return {};
  }
  keep_top(in.options->top_k, in.options->top_p, in.options->temperature);
  XDS_CHECK(n_cand_ > 0 && total_ > 0.0, "sampling kept no candidate");
  return {};
}

int32_t Sampler::pick(double u) const {
  double target = u * total_;
  for (size_t i = 0; i < n_cand_; ++i) {
    target -= cand_[i].weight;
    if (target < 0.0) return cand_[i].id;
  }
  return cand_[n_cand_ - 1].id;  // u * total rounded up to the total
}

int32_t Sampler::pick_excluding(int32_t excluded, double u) const {
  double rest = total_;
  for (size_t i = 0; i < n_cand_; ++i) {
    if (cand_[i].id == excluded) rest -= cand_[i].weight;
  }
  if (!(rest > 0.0)) return excluded;
  double target = u * rest;
  int32_t last = excluded;
  for (size_t i = 0; i < n_cand_; ++i) {
    if (cand_[i].id == excluded) continue;
    last = cand_[i].id;
    target -= cand_[i].weight;
    if (target < 0.0) return last;
  }
  return last;
}

double Sampler::probability(int32_t id) const {
  for (size_t i = 0; i < n_cand_; ++i) {
    if (cand_[i].id == id) return cand_[i].weight / total_;
  }
  return 0.0;
}

Status Sampler::raw_logprobs(const float* logits, int64_t valid_vocab, int32_t token, int32_t k,
                             TokenLogprob* out) {
  XDS_RETURN_IF_ERROR(check_row(logits, valid_vocab));
  if (token < 0 || token >= valid_vocab)
    return invalid_argument("logprobs: token {} outside [0, {})", token, valid_vocab);
  if (k < 0) return invalid_argument("logprobs: k must be >= 0, got {}", k);
  double mx = logits[0];
  for (int64_t i = 1; i < valid_vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < valid_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  out->token = token;
  out->logprob = static_cast<float>(logits[token] - lse);
  out->top.clear();
  const int64_t kk = std::min<int64_t>(k, valid_vocab);
  if (kk == 0) return {};
  order_.resize(static_cast<size_t>(valid_vocab));
  std::iota(order_.begin(), order_.end(), 0);
  std::partial_sort(order_.begin(), order_.begin() + kk, order_.end(),
                    [logits](int32_t a, int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  for (int64_t i = 0; i < kk; ++i) {
    const int32_t id = order_[i];
    out->top.emplace_back(id, static_cast<float>(logits[id] - lse));
  }
  return {};
}

Result<int32_t> Sampler::sample(const SampleInput& in, TokenLogprob* logprobs) {
  XDS_RETURN_IF_ERROR(prepare(in));
  const int32_t token = pick(sample_uniform(in.options->seed, in.position, in.draw));
  if (logprobs != nullptr && in.options->logprobs >= 0) {
    XDS_RETURN_IF_ERROR(
        raw_logprobs(in.logits, in.valid_vocab, token, in.options->logprobs, logprobs));
  }
  return token;
}

}  // namespace xds::engine

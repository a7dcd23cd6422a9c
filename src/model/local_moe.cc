#include "model/local_moe.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "model/deepseek_v3.h"

namespace xds {

const MoeWeights& LocalMoeExchange::layer_weights(int64_t layer) const {
  if (layer < config_.num_hidden_layers) return *weights_.layers[layer].moe;
  return *weights_.mtp[layer - config_.num_hidden_layers].layer.moe;
}

Status LocalMoeExchange::run(const MoeExchangeInput& in) {
  const MoeWeights& w = layer_weights(in.layer);
  const int64_t d = config_.hidden_size;
  const int64_t experts = static_cast<int64_t>(w.experts.size());
  if (in.top_k > 64) return unimplemented("MoE: num_experts_per_tok {} > 64", in.top_k);
  std::memset(in.out, 0, sizeof(float) * static_cast<size_t>(in.n * d));

  // offsets_[e] .. offsets_[e+1]: the (token * top_k + slot) entries routed to expert e.
  offsets_.assign(static_cast<size_t>(experts + 1), 0);
  const int64_t entries = in.n * in.top_k;
  for (int64_t i = 0; i < entries; ++i) {
    const int32_t e = in.ids[i];
    if (e < 0 || e >= experts)
      return internal_error("MoE: expert id {} out of range [0, {})", e, experts);
    ++offsets_[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) offsets_[e + 1] += offsets_[e];
  order_.resize(static_cast<size_t>(entries));
  {
    std::vector<int32_t> fill(offsets_.begin(), offsets_.end() - 1);
    for (int64_t i = 0; i < entries; ++i) order_[fill[in.ids[i]]++] = static_cast<int32_t>(i);
  }

  active_.clear();
  for (int64_t e = 0; e < experts; ++e) {
    if (offsets_[e + 1] > offsets_[e]) active_.push_back(static_cast<int32_t>(e));
  }
  const int64_t d_total = entries * d;
  if (staged_.size() < static_cast<size_t>(d_total)) staged_.resize(static_cast<size_t>(d_total));
  ThreadPool& pool = linear_.pool();
  scratch_.resize(static_cast<size_t>(pool.num_threads()));
  // Experts differ in token counts by many times, so threads take them one at a time,
  // largest first (longest-processing-time order), instead of in fixed halves. Which thread
  // runs an expert does not change any result: each writes only its own staged rows.
  auto tokens_of = [&](int32_t e) { return offsets_[e + 1] - offsets_[e]; };
  std::stable_sort(active_.begin(), active_.end(),
                   [&](int32_t a, int32_t b) { return tokens_of(a) > tokens_of(b); });
  std::atomic<int64_t> next{0};
  pool.run_on_all([&](int thread) {
    bool overlap_claimed = in.overlap == nullptr;
    for (int64_t a = next.fetch_add(1, std::memory_order_relaxed);
         a < static_cast<int64_t>(active_.size());
         a = next.fetch_add(1, std::memory_order_relaxed)) {
      const int32_t e = active_[a];
      // One slice of the caller's work before each expert: the slice is compute-bound, the
      // expert memory-bound at decode, so the two threads' mix keeps the bus busier.
      if (!overlap_claimed) overlap_claimed = in.overlap->run_slice() == OverlapWork::Slice::kDone;
      run_expert(w.experts[e], in, offsets_[e], tokens_of(e), scratch_[thread]);
    }
    while (!overlap_claimed) {
      const OverlapWork::Slice r = in.overlap->run_slice();
      if (r == OverlapWork::Slice::kNotReady) _mm_pause();
      overlap_claimed = r == OverlapWork::Slice::kDone;
    }
  });
  // out[t] = Σ over t's slots in ascending expert id of the staged rows.
  pool.parallel_for(in.n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      int32_t slots[64];  // top_k <= 64, checked above
      const int64_t k = in.top_k;
      for (int64_t j = 0; j < k; ++j) slots[j] = static_cast<int32_t>(t * in.top_k + j);
      std::sort(slots, slots + k, [&](int32_t a, int32_t b) { return in.ids[a] < in.ids[b]; });
      float* o = in.out + t * d;
      for (int64_t j = 0; j < k; ++j) {
        const float* row = staged_.data() + static_cast<int64_t>(slots[j]) * d;
        for (int64_t i = 0; i < d; ++i) o[i] += row[i];
      }
    }
  });
  return {};
}

void LocalMoeExchange::linear_inline(const float* x, int64_t n, const MatrixRef& w, float* y,
                                     ThreadScratch& s) {
  if (linear_.compute() == ComputeDType::kF32) {
    // Row-major (F32) expert matrices are 1-4 MB, so widening them for sgemm already pays
    // from ~16 tokens on (prefill of bench-2.6b: expert time -9 % against the default 64).
    // BF16 panels ignore the threshold: the panel kernel runs at every n (linear.h).
    constexpr int64_t kExpertSgemmMinTokens = 16;
    kernels::linear_f32(x, n, w.cols, w, y, w.rows, inline_pool_, kExpertSgemmMinTokens);
    return;
  }
  s.bf16.resize(static_cast<size_t>(n * w.cols));
  kernels::round_to_bf16(x, n * w.cols, s.bf16.data());
  kernels::linear_bf16(s.bf16.data(), n, w.cols, w, y, w.rows, inline_pool_);
}

void LocalMoeExchange::run_expert(const MlpWeights& mlp, const MoeExchangeInput& in, int64_t begin,
                                  int64_t m, ThreadScratch& s) {
  const int64_t d = config_.hidden_size, inter = config_.moe_intermediate_size;
  s.xe.resize(static_cast<size_t>(m * d));
  s.gate.resize(static_cast<size_t>(m * inter));
  s.up.resize(static_cast<size_t>(m * inter));
  s.down.resize(static_cast<size_t>(m * d));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t token = order_[begin + i] / in.top_k;
    std::memcpy(s.xe.data() + i * d, in.x + token * d, sizeof(float) * static_cast<size_t>(d));
  }
  linear_inline(s.xe.data(), m, mlp.gate_proj, s.gate.data(), s);
  linear_inline(s.xe.data(), m, mlp.up_proj, s.up.data(), s);
  kernels::silu_mul(s.gate.data(), s.up.data(), m * inter, s.gate.data());
  linear_inline(s.gate.data(), m, mlp.down_proj, s.down.data(), s);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t entry = order_[begin + i];
    float* row = staged_.data() + entry * d;
    const float wgt = in.weights[entry];
    const float* src = s.down.data() + i * d;
    for (int64_t j = 0; j < d; ++j) row[j] = wgt * src[j];
  }
}

}  // namespace xds

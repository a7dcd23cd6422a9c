#include "model/local_moe.h"

#include <algorithm>
#include <cstring>

namespace xds {

Status LocalMoeExchange::run(const MoeExchangeInput& in) {
  if (in.n == 0 && in.overlap == nullptr) return {};
  if (in.layer < 0 || in.layer >= static_cast<int64_t>(layers_.size()) ||
      layers_[static_cast<size_t>(in.layer)] == nullptr)
    return invalid_argument("MoE: layer {} has no routed experts", in.layer);
  const MoeWeights& w = *layers_[static_cast<size_t>(in.layer)];
  const int64_t d = hidden_;
  const int64_t experts = static_cast<int64_t>(w.experts.size());
  if (in.top_k > 64) return unimplemented("MoE: num_experts_per_tok {} > 64", in.top_k);

  // offsets_[e] .. offsets_[e+1]: the grouped rows, i.e. (token * top_k + slot) entries,
  // routed to expert e, in entry order.
  offsets_.assign(static_cast<size_t>(experts + 1), 0);
  const int64_t entries = in.n * in.top_k;
  for (int64_t i = 0; i < entries; ++i) {
    const int32_t e = in.ids[i];
    if (e < 0 || e >= experts)
      return internal_error("MoE: expert id {} out of range [0, {})", e, experts);
    ++offsets_[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) offsets_[e + 1] += offsets_[e];
  grouped_of_.resize(static_cast<size_t>(entries));
  gather_.resize(static_cast<size_t>(entries));
  scale_.resize(static_cast<size_t>(entries));
  fill_.assign(offsets_.begin(), offsets_.end() - 1);
  for (int64_t i = 0; i < entries; ++i) {
    const int32_t row = fill_[in.ids[i]]++;
    grouped_of_[i] = row;
    gather_[row] = static_cast<int32_t>(i / in.top_k);
    scale_[row] = in.weights[i];
  }
  slots_.resize(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) slots_[e] = &w.experts[e];
  const int64_t d_total = entries * d;
  if (staged_.size() < static_cast<size_t>(d_total)) staged_.resize(static_cast<size_t>(d_total));

  GroupedExpertsInput g;
  g.slots = slots_;
  g.offsets = offsets_;
  g.rows = in.x;
  g.row_dtype = DType::kF32;
  g.row_stride = d;
  g.gather = gather_.data();
  g.scale = scale_.data();
  g.out = staged_.data();
  g.overlap = in.overlap;
  XDS_RETURN_IF_ERROR(experts_.run(g));

  // out[t] = Σ over t's slots in ascending expert id of the staged rows.
  pool_.parallel_for(in.n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      int32_t slots[64];  // top_k <= 64, checked above
      const int64_t k = in.top_k;
      for (int64_t j = 0; j < k; ++j) slots[j] = static_cast<int32_t>(t * in.top_k + j);
      std::sort(slots, slots + k, [&](int32_t a, int32_t b) { return in.ids[a] < in.ids[b]; });
      float* o = in.out + t * d;
      std::memset(o, 0, sizeof(float) * static_cast<size_t>(d));
      for (int64_t j = 0; j < k; ++j) {
        const float* row = staged_.data() + static_cast<int64_t>(grouped_of_[slots[j]]) * d;
        for (int64_t i = 0; i < d; ++i) o[i] += row[i];
      }
    }
  });
  return {};
}

namespace {

struct OwnedLocalMoe final : MoeExchange {
  OwnedLocalMoe(std::vector<const MoeWeights*> layers, int64_t hidden, ComputeDType dt,
                ThreadPool& pool)
      : linear(dt, pool), exchange(std::move(layers), hidden, linear) {}
  Status run(const MoeExchangeInput& in) override { return exchange.run(in); }
  LinearRunner linear;
  LocalMoeExchange exchange;
};

}  // namespace

std::unique_ptr<MoeExchange> make_owned_local_moe(std::vector<const MoeWeights*> layers,
                                                  int64_t hidden, ComputeDType dt,
                                                  ThreadPool& pool) {
  return std::make_unique<OwnedLocalMoe>(std::move(layers), hidden, dt, pool);
}

}  // namespace xds

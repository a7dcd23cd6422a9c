#include "model/local_moe.h"

#include <cstring>

#include "kernels/cpu/ops.h"

namespace xds {

const MoeWeights& LocalMoeExchange::layer_weights(int64_t layer) const {
  if (layer < config_.num_hidden_layers) return *weights_.layers[layer].moe;
  return *weights_.mtp[layer - config_.num_hidden_layers].layer.moe;
}

Status LocalMoeExchange::run(const MoeExchangeInput& in) {
  const MoeWeights& w = layer_weights(in.layer);
  const int64_t d = config_.hidden_size;
  const int64_t inter = config_.moe_intermediate_size;
  const int64_t experts = static_cast<int64_t>(w.experts.size());
  std::memset(in.out, 0, sizeof(float) * static_cast<size_t>(in.n * d));

  // offsets_[e] .. offsets_[e+1]: the (token * top_k + slot) entries routed to expert e.
  offsets_.assign(static_cast<size_t>(experts + 1), 0);
  const int64_t entries = in.n * in.top_k;
  for (int64_t i = 0; i < entries; ++i) {
    const int32_t e = in.ids[i];
    if (e < 0 || e >= experts) return internal_error("MoE: expert id {} out of range [0, {})", e, experts);
    ++offsets_[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) offsets_[e + 1] += offsets_[e];
  order_.resize(static_cast<size_t>(entries));
  {
    std::vector<int32_t> fill(offsets_.begin(), offsets_.end() - 1);
    for (int64_t i = 0; i < entries; ++i) order_[fill[in.ids[i]]++] = static_cast<int32_t>(i);
  }

  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets_[e], m = offsets_[e + 1] - offsets_[e];
    if (m == 0) continue;
    xe_.resize(static_cast<size_t>(m * d));
    gate_.resize(static_cast<size_t>(m * inter));
    up_.resize(static_cast<size_t>(m * inter));
    down_.resize(static_cast<size_t>(m * d));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t token = order_[begin + i] / in.top_k;
      std::memcpy(xe_.data() + i * d, in.x + token * d, sizeof(float) * static_cast<size_t>(d));
    }
    const MlpWeights& mlp = w.experts[e];
    linear_(xe_.data(), m, d, mlp.gate_proj, gate_.data(), inter);
    linear_(xe_.data(), m, d, mlp.up_proj, up_.data(), inter);
    kernels::silu_mul(gate_.data(), up_.data(), m * inter, gate_.data());
    linear_(gate_.data(), m, inter, mlp.down_proj, down_.data(), d);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t entry = order_[begin + i];
      kernels::axpy(in.weights[entry], down_.data() + i * d, d, in.out + (entry / in.top_k) * d);
    }
  }
  return {};
}

}  // namespace xds

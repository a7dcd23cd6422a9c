// LocalMoeExchange: every routed expert computed in this process (one device, no EP).
//
// Tokens are grouped by expert (counting sort), each expert runs one batched MLP over its
// tokens, [m, D] -> [m, I] (gate, up) -> [m, D] (down), and the results are added into
// out[t] with the gating weights. Logical == physical ids (the identity expert map).
// Thread-safety: one run() at a time.
#pragma once

#include <vector>

#include "model/deepseek_v3_weights.h"
#include "model/linear_runner.h"
#include "model/moe_exchange.h"

namespace xds {

class LocalMoeExchange final : public MoeExchange {
 public:
  LocalMoeExchange(const DeepseekV3Config& config, const DeepseekV3Weights& weights,
                   LinearRunner& linear)
      : config_(config), weights_(weights), linear_(linear) {}
  Status run(const MoeExchangeInput& in) override;

 private:
  const MoeWeights& layer_weights(int64_t layer) const;

  const DeepseekV3Config& config_;
  const DeepseekV3Weights& weights_;
  LinearRunner& linear_;
  std::vector<int32_t> offsets_, order_;        // counting sort of (token, slot) by expert
  std::vector<float> xe_, gate_, up_, down_;    // [m, D], [m, I], [m, I], [m, D]
};

}  // namespace xds

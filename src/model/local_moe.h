// LocalMoeExchange: every routed expert computed in this process (one device, no EP).
//
// Tokens are grouped by expert (counting sort), each expert runs one batched MLP over its
// tokens, [m, D] -> [m, I] (gate, up) -> [m, D] (down). Experts run in parallel, one per
// pool thread at a time (no pool wake-up per matrix), each writing its outputs to the
// (token, slot) rows of a staging buffer; out[t] then sums token t's rows in ascending
// expert order, so the result does not depend on the thread count or the batch.
// Logical == physical ids (the identity expert map). Thread-safety: one run() at a time.
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
  struct ThreadScratch {
    std::vector<float> xe, gate, up, down;  // [m, D], [m, I], [m, I], [m, D]
    std::vector<uint16_t> bf16;             // [m, max(D, I)] rounded inputs (bf16 mode)
  };
  void run_expert(const MlpWeights& mlp, const MoeExchangeInput& in, int64_t begin, int64_t m,
                  ThreadScratch& s);
  void linear_inline(const float* x, int64_t n, const MatrixRef& w, float* y, ThreadScratch& s);

  std::vector<int32_t> offsets_, order_;  // counting sort of (token, slot) by expert
  std::vector<int32_t> active_;           // experts with tokens
  std::vector<float> staged_;             // [n * top_k, D] weighted expert outputs
  std::vector<ThreadScratch> scratch_;    // one per pool thread
  ThreadPool inline_pool_{1};
};

}  // namespace xds

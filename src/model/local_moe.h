// LocalMoeExchange: every routed expert computed in this process (one device, no EP).
//
// The (token, slot) entries are grouped by expert (counting sort), GroupedExperts runs each
// expert's batched MLP over its rows into a staging buffer in grouped order, weighted by the
// gating weight; out[t] then sums token t's rows in ascending expert order, so the result
// does not depend on the thread count or the batch. Logical == physical ids (the identity
// expert map: slot e holds expert e). Thread-safety: one run() at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model/grouped_experts.h"
#include "model/linear_runner.h"
#include "model/moe_exchange.h"
#include "model/moe_weights.h"

namespace xds {

class LocalMoeExchange final : public MoeExchange {
 public:
  // layers: [cache layers] each layer's routed experts (nullptr for a dense one; the weights
  // outlive the exchange); hidden: D.
  LocalMoeExchange(std::vector<const MoeWeights*> layers, int64_t hidden, LinearRunner& linear)
      : layers_(std::move(layers)),
        hidden_(hidden),
        pool_(linear.pool()),
        experts_(linear.compute(), linear.pool()) {}
  // n = 0 (a step with no tokens) does nothing. InvalidArgument for a layer without experts.
  Status run(const MoeExchangeInput& in) override;

 private:
  std::vector<const MoeWeights*> layers_;
  int64_t hidden_ = 0;
  ThreadPool& pool_;
  GroupedExperts experts_;
  std::vector<const MlpWeights*> slots_;  // [E] the identity map
  std::vector<int32_t> offsets_;          // [E + 1] grouped rows of each expert
  std::vector<int32_t> fill_;             // [E] counting sort's next row per expert
  std::vector<int32_t> grouped_of_;       // [n * top_k] entry (token * top_k + j) -> grouped row
  std::vector<int32_t> gather_;           // [n * top_k] grouped row -> token
  std::vector<float> scale_;              // [n * top_k] grouped row -> gating weight
  std::vector<float> staged_;             // [n * top_k, D] weighted expert outputs, grouped
};

// A model's own in-process MoE exchange: a LocalMoeExchange with a LinearRunner (and so a
// bf16 scratch) of its own, for models that run without expert parallelism.
std::unique_ptr<MoeExchange> make_owned_local_moe(std::vector<const MoeWeights*> layers,
                                                  int64_t hidden, ComputeDType dt,
                                                  ThreadPool& pool);

}  // namespace xds

// The MoE layer's view of "where the experts are" (docs/design/architecture.md, "Experts
// are addressed through a map"). Gating yields logical expert ids; an exchange computes
//   out[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t])
// wherever those experts live: locally (LocalMoeExchange, model/local_moe.h), on the other
// devices of an expert-parallel instance (EpMoeExchange, engine/ep_moe_exchange.h), or on
// expert devices across A2E/E2A (xccl/a2e.h).
//
// The interface is family-independent: the input is plain rows, ids and weights of one
// layer, and what an exchange needs to know of the model comes from ModelInfo (experts,
// top-k, MoE layers: causal_lm.h) and the layers' MoeWeights (moe_weights.h). An
// attention-to-expert exchange implements run() on an attention device as: the rows, ids and
// weights of `layer` go out through A2E (xccl::A2e, the device's DP domain and round), the
// expert devices compute, and E2A brings back one [n, hidden] sum into `out`; the expert
// devices run their side from the same (layer, step) keys and need no model forward.
// Copies of a replicated expert are chosen by the row of x (eplb::spread_slot).
#pragma once

#include <cstdint>

#include "base/status.h"

namespace xds {

// Work of the caller's that the exchange runs on its own threads while its experts are in
// flight: the shared experts, which need only the layer's input (an expert-parallel
// exchange would run them while dispatch and combine are on the wire). The work comes in
// slices, claimed by any thread.
// Thread-safety: run_slice is called concurrently from the exchange's threads.
class OverlapWork {
 public:
  enum class Slice {
    kRan,       // ran one slice
    kNotReady,  // slices remain but wait for others in progress (call again)
    kDone,      // every slice has been claimed
  };
  // Claims and runs one slice on the calling thread.
  virtual Slice run_slice() = 0;

 protected:
  ~OverlapWork() = default;
};

// One MoE layer of one step on this device. Row t of x, ids, weights and out is the step's
// token t (batch order); every device of an exchange makes the same sequence of calls, one
// per MoE layer the step runs, n = 0 included.
struct MoeExchangeInput {
  int64_t layer = 0;         // cache layer index (MTP layers included)
  const float* x = nullptr;  // [n, hidden] post-attention-normed activations
  int64_t n = 0;
  const int32_t* ids = nullptr;    // [n, top_k] logical expert ids
  const float* weights = nullptr;  // [n, top_k] gating weights (already scaled)
  int64_t top_k = 0;
  float* out = nullptr;  // [n, hidden] overwritten with the routed experts' sum
  // Optional: when run() returns, every slice of it has run (to completion).
  OverlapWork* overlap = nullptr;
};

// Thread-safety: run() is called on the model's stepping thread, one at a time.
class MoeExchange {
 public:
  virtual ~MoeExchange() = default;
  // Overwrites in.out's n rows; an error leaves them unspecified (the step fails).
  virtual Status run(const MoeExchangeInput& in) = 0;
};

}  // namespace xds

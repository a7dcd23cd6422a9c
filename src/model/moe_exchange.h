// The MoE layer's view of "where the experts are" (docs/design/architecture.md, "Experts
// are addressed through a map"). Gating yields logical expert ids; an exchange computes
//   out[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t])
// wherever those experts live: locally (LocalMoeExchange), on the other devices of an
// expert-parallel instance (engine/), or on expert devices across A2E/E2A (disagg/).
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

struct MoeExchangeInput {
  int64_t layer = 0;         // decoder layer index (MTP layers included)
  const float* x = nullptr;  // [n, hidden] post-attention-normed activations
  int64_t n = 0;
  const int32_t* ids = nullptr;    // [n, top_k] logical expert ids
  const float* weights = nullptr;  // [n, top_k] gating weights (already scaled)
  int64_t top_k = 0;
  float* out = nullptr;  // [n, hidden] overwritten with the routed experts' sum
  // Optional: when run() returns, every slice of it has run (to completion).
  OverlapWork* overlap = nullptr;
  // Optional: [n] each token's position in its sequence. An expert with several copies
  // (EPLB's replicas) serves a token by its position (P078); null: by its index in the batch.
  const int64_t* positions = nullptr;
};

class MoeExchange {
 public:
  virtual ~MoeExchange() = default;
  virtual Status run(const MoeExchangeInput& in) = 0;
};

}  // namespace xds

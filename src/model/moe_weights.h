// The weights of a gated MLP and of a MoE layer's router and experts, bound in the kernels'
// layout (MatrixRef into the checkpoint's mmap or a repack file). D = hidden, I = the MLP's
// intermediate width, E = routed experts. Any MoE family binds its layers into these; the
// exchange, the expert slots and the local experts read nothing else.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "tensor/matrix.h"

namespace xds {

struct MlpWeights {
  MatrixRef gate_proj;  // [I, D]
  MatrixRef up_proj;    // [I, D]
  MatrixRef down_proj;  // [D, I]
};

struct MoeWeights {
  MatrixRef router;                   // [E, D]
  std::span<const float> score_bias;  // [E] the router's correction bias, empty if none
  std::vector<MlpWeights> experts;    // [E]
  std::optional<MlpWeights> shared;   // the shared experts as one MLP, width n_shared * I
};

}  // namespace xds

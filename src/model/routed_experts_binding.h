// Binding one MoE layer's routed experts, the same for every family: experts
// `<layer>.mlp.experts.<e>` for e < count, each through the family's own MLP binder, all in one
// repack bundle (RepackCache::bind_bundle), so that experts smaller than 2 MB still stream
// from 2 MB pages (model/repack_bundle.h).
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/status.h"
#include "model/moe_weights.h"
#include "model/weights.h"

namespace xds {

// bind_mlp(module prefix) -> Result<MlpWeights>; appends the experts to `out` in order.
template <class BindMlp>
Status bind_routed_experts(RepackCache& cache, const std::string& layer, int64_t count,
                           BindMlp&& bind_mlp, std::vector<MlpWeights>& out) {
  out.reserve(out.size() + static_cast<size_t>(count));
  return cache.bind_bundle(layer + ".mlp.experts", [&]() -> Status {
    for (int64_t e = 0; e < count; ++e) {
      XDS_ASSIGN_OR_RETURN(MlpWeights m, bind_mlp(fmt::format("{}.mlp.experts.{}", layer, e)));
      out.push_back(m);
    }
    return {};
  });
}

}  // namespace xds

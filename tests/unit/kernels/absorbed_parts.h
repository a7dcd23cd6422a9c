// The absorbed attention of a whole context computed in parts (mla_absorbed_attention_part
// over [cut[p], cut[p + 1])) and merged (mla_absorbed_merge): out [heads, latent_dim].
#pragma once

#include <vector>

#include "kernels/cpu/mla_attention.h"

namespace xds::kernels {

inline std::vector<float> attend_in_parts(const AbsorbedQuery& q, int64_t heads,
                                          const LatentKvView& kv, const std::vector<int64_t>& cut,
                                          float scale) {
  const int64_t lat = kv.latent_dim, parts = static_cast<int64_t>(cut.size()) - 1;
  std::vector<float> part_out(static_cast<size_t>(parts * heads * lat)),
      ml(static_cast<size_t>(parts * 2 * heads)), out(static_cast<size_t>(heads * lat), -7.0f);
  std::vector<AbsorbedPart> ps;
  for (int64_t p = 0; p < parts; ++p) {
    ps.push_back({part_out.data() + p * heads * lat, lat, ml.data() + p * 2 * heads,
                  ml.data() + p * 2 * heads + heads});
    mla_absorbed_attention_part(q, 0, heads, kv, cut[p], cut[p + 1], scale, ps.back());
  }
  mla_absorbed_merge(ps, heads, lat, out.data(), lat);
  return out;
}

}  // namespace xds::kernels

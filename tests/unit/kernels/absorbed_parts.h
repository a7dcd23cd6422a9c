// Helpers of the absorbed-attention tests: a plain double-precision reference, and the
// kernel run over a context cut into parts and merged.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/mla_attention.h"

namespace xds::kernels {

// A block table that is the permutation b -> (b * mul + add) % blocks (mul coprime to
// blocks): context position s lives in block table[s / block_size], out of order.
inline std::vector<int32_t> permuted_block_table(int64_t blocks, int64_t mul, int64_t add) {
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>((b * mul + add) % blocks);
  return table;
}

// Attention of every head over [0, ctx) in double precision, every query and cached value
// passed through round() first (the identity, or a rounding the kernel applies): out
// [heads, latent_dim].
inline std::vector<double> reference_absorbed(
    const std::vector<float>& q_abs, const std::vector<float>& q_pe, int64_t heads,
    const LatentKvView& kv, int64_t ctx, double scale,
    float (*round)(float) = [](float v) { return v; }) {
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  std::vector<double> out(static_cast<size_t>(heads * lat), 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> s(static_cast<size_t>(ctx));
    for (int64_t j = 0; j < ctx; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < lat; ++c)
        acc += double(round(q_abs[h * lat + c])) * round(kv.latent_at(j)[c]);
      for (int64_t c = 0; c < dr; ++c)
        acc += double(round(q_pe[h * dr + c])) * round(kv.rope_at(j)[c]);
      s[j] = acc * scale;
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double z = 0.0;
    for (double& x : s) z += (x = std::exp(x - mx));
    for (int64_t j = 0; j < ctx; ++j)
      for (int64_t c = 0; c < lat; ++c) out[h * lat + c] += s[j] / z * round(kv.latent_at(j)[c]);
  }
  return out;
}

// The kernel over the context cut at `cut` (mla_absorbed_attention_part over [cut[p],
// cut[p + 1])), merged (mla_absorbed_merge): out [heads, latent_dim].
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

// The expanded MLA prefill kernel against a plain double-precision causal attention.
#include "kernels/cpu/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace xds::kernels {
namespace {

TEST(MlaExpanded, MatchesCausalAttentionReference) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t heads = 3, dn = 16, dr = 8, dv = 12, dq = dn + dr, dkv = dn + dv;
  // m = 70 crosses the 64-row block; p0 = 5 cached positions before the chunk.
  for (const auto& [m, p0] : {std::pair<int64_t, int64_t>{70, 5}, {9, 0}, {1, 30}}) {
    const int64_t ctx = p0 + m;
    std::vector<float> q(static_cast<size_t>(m * heads * dq)), kv(static_cast<size_t>(ctx * heads * dkv)),
        rope(static_cast<size_t>(ctx * dr)), out(static_cast<size_t>(m * heads * dv), -9.0f);
    for (auto* v : {&q, &kv, &rope})
      for (float& x : *v) x = d(rng);
    const float scale = 0.37f;
    const ExpandedChunk c{q.data(), heads * dq, kv.data(), heads * dkv, rope.data(),
                          out.data(), heads * dv, m, p0, dn, dr, dv};
    std::vector<float> scratch(static_cast<size_t>(kExpandedRowBlock * ctx));
    for (int64_t h = 0; h < heads; ++h) mla_expanded_attention(c, h, scale, scratch.data());

    for (int64_t t = 0; t < m; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t visible = p0 + t + 1;
        std::vector<double> s(static_cast<size_t>(visible));
        const float* qt = q.data() + (t * heads + h) * dq;
        for (int64_t j = 0; j < visible; ++j) {
          double acc = 0.0;
          const float* k = kv.data() + (j * heads + h) * dkv;
          for (int64_t i = 0; i < dn; ++i) acc += double(qt[i]) * k[i];
          for (int64_t i = 0; i < dr; ++i) acc += double(qt[dn + i]) * rope[j * dr + i];
          s[j] = acc * scale;
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double z = 0.0;
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int64_t i = 0; i < dv; ++i) {
          double ref = 0.0;
          for (int64_t j = 0; j < visible; ++j) ref += s[j] / z * kv[(j * heads + h) * dkv + dn + i];
          ASSERT_NEAR(out[(t * heads + h) * dv + i], ref, 2e-5)
              << "m=" << m << " p0=" << p0 << " t=" << t << " h=" << h << " i=" << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace xds::kernels

#include "kernels/cpu/mla_attention.h"

#include <cstring>

#include "kernels/cpu/ops.h"

namespace xds::kernels {
namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void mla_absorbed_attention_head(const AbsorbedQuery& q, int64_t head, const LatentKvView& kv,
                                 int64_t ctx, float scale, float* scores) {
  const float* qa = q.q_abs + head * q.q_abs_ld;
  const float* qp = q.q_pe + head * q.q_pe_ld;
  for (int64_t s = 0; s < ctx; ++s) {
    scores[s] = (dot(qa, kv.latent_at(s), kv.latent_dim) + dot(qp, kv.rope_at(s), kv.rope_dim)) * scale;
  }
  softmax_inplace(scores, ctx);
  float* out = q.out + head * q.out_ld;
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(kv.latent_dim));
  for (int64_t s = 0; s < ctx; ++s) axpy(scores[s], kv.latent_at(s), kv.latent_dim, out);
}

}  // namespace xds::kernels

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

void mla_absorbed_attention(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                            const LatentKvView& kv, int64_t ctx, float scale, float* scores) {
  const int64_t nh = head_end - head_begin;
  // scores[j, s] for head head_begin + j.
  for (int64_t s = 0; s < ctx; ++s) {
    const float* lat = kv.latent_at(s);
    const float* rope = kv.rope_at(s);
    for (int64_t j = 0; j < nh; ++j) {
      const int64_t h = head_begin + j;
      scores[j * ctx + s] = (dot(q.q_abs + h * q.q_abs_ld, lat, kv.latent_dim) +
                             dot(q.q_pe + h * q.q_pe_ld, rope, kv.rope_dim)) *
                            scale;
    }
  }
  for (int64_t j = 0; j < nh; ++j) {
    softmax_inplace(scores + j * ctx, ctx);
    std::memset(q.out + (head_begin + j) * q.out_ld, 0,
                sizeof(float) * static_cast<size_t>(kv.latent_dim));
  }
  for (int64_t s = 0; s < ctx; ++s) {
    const float* lat = kv.latent_at(s);
    for (int64_t j = 0; j < nh; ++j)
      axpy(scores[j * ctx + s], lat, kv.latent_dim, q.out + (head_begin + j) * q.out_ld);
  }
}

}  // namespace xds::kernels

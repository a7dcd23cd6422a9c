#include "kernels/cpu/gqa_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/bf16.h"
#include "kernels/cpu/ops.h"

namespace xds::kernels {
namespace {

// Scratch, in floats (R = m · group query rows, B = block_size, Dh = head_dim):
//   k_tile [B, Dh]  v_tile [B, Dh]  (bf16 blocks widened, int8 ones dequantized; unused for
//   f32 planes)
//   scores [B]  row_max [R]  row_sum [R]
struct Scratch {
  float* k_tile;
  float* v_tile;
  float* scores;
  float* row_max;
  float* row_sum;
};

Scratch carve(float* s, int64_t rows, int64_t block_size, int64_t head_dim) {
  Scratch c;
  c.k_tile = s;
  c.v_tile = c.k_tile + block_size * head_dim;
  c.scores = c.v_tile + block_size * head_dim;
  c.row_max = c.scores + block_size;
  c.row_sum = c.row_max + rows;
  return c;
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// rows [rows, dh] of int8 q with a scale each -> q · scale (exactly the stored value).
void dequantize_i8(const std::byte* src, const std::byte* scales, int64_t rows, int64_t dh,
                   float* dst) {
  const auto* q = reinterpret_cast<const int8_t*>(src);
  const auto* s = reinterpret_cast<const float*>(scales);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = s[r];
#pragma omp simd
    for (int64_t i = 0; i < dh; ++i) dst[r * dh + i] = static_cast<float>(q[r * dh + i]) * scale;
  }
}

void widen_bf16(const std::byte* src, int64_t count, float* dst) {
  const auto* s = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
}

}  // namespace

int64_t gqa_scratch_floats(int64_t m, int64_t group, int64_t block_size, int64_t head_dim) {
  return 2 * block_size * head_dim + block_size + 2 * m * group;
}

void gqa_attention(const GqaQueries& q, const GqaKvView& kv, float* scratch) {
  const int64_t dh = kv.head_dim, bs = kv.block_size, rows = q.m * q.group;
  const Scratch s = carve(scratch, rows, bs, dh);
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  std::fill(s.row_max, s.row_max + rows, kMinusInf);
  std::fill(s.row_sum, s.row_sum + rows, 0.0f);
  for (int64_t t = 0; t < q.m; ++t) {
    std::memset(q.out + t * q.out_ld, 0, sizeof(float) * static_cast<size_t>(q.group * dh));
  }
  const int64_t context = q.first_pos + q.m;  // rows [0, context) are read
  const bool bf16 = kv.dtype == DType::kBF16, i8 = kv.dtype == DType::kI8;
  for (int64_t block = 0; block * bs < context; ++block) {
    const int64_t s0 = block * bs;
    const int64_t in_block = std::min(bs, context - s0);
    const std::byte* b = kv.base + kv.block_table[block] * kv.block_bytes;
    const float* k_rows;  // [in_block, dh]
    const float* v_rows;
    if (bf16 || i8) {
      if (bf16) {
        widen_bf16(b + kv.k_offset, in_block * dh, s.k_tile);
        widen_bf16(b + kv.v_offset, in_block * dh, s.v_tile);
      } else {
        dequantize_i8(b + kv.k_offset, b + kv.k_scale_offset, in_block, dh, s.k_tile);
        dequantize_i8(b + kv.v_offset, b + kv.v_scale_offset, in_block, dh, s.v_tile);
      }
      k_rows = s.k_tile;
      v_rows = s.v_tile;
    } else {
      k_rows = reinterpret_cast<const float*>(b + kv.k_offset);
      v_rows = reinterpret_cast<const float*>(b + kv.v_offset);
    }
    for (int64_t t = 0; t < q.m; ++t) {
      // Rows of this block the token sees: positions <= first_pos + t.
      const int64_t visible = std::min(in_block, q.first_pos + t + 1 - s0);
      if (visible <= 0) continue;
      for (int64_t g = 0; g < q.group; ++g) {
        const int64_t r = t * q.group + g;
        const float* qr = q.q + t * q.ld + g * dh;
        float* acc = q.out + t * q.out_ld + g * dh;
        for (int64_t j = 0; j < visible; ++j) s.scores[j] = dot(qr, k_rows + j * dh, dh);
        const float block_max = scale_and_max(s.scores, visible, q.scale);
        const float new_max = std::max(s.row_max[r], block_max);
        const float shrink = std::exp(s.row_max[r] - new_max);  // 0 on the first block
        const float block_sum = exp_shifted_sum(s.scores, visible, new_max);
        s.row_sum[r] = s.row_sum[r] * shrink + block_sum;
        s.row_max[r] = new_max;
#pragma omp simd
        for (int64_t i = 0; i < dh; ++i) acc[i] *= shrink;
        for (int64_t j = 0; j < visible; ++j) {
          const float p = s.scores[j];
          const float* vr = v_rows + j * dh;
#pragma omp simd
          for (int64_t i = 0; i < dh; ++i) acc[i] += p * vr[i];
        }
      }
    }
  }
  for (int64_t t = 0; t < q.m; ++t) {
    for (int64_t g = 0; g < q.group; ++g) {
      const float inv = 1.0f / s.row_sum[t * q.group + g];
      float* acc = q.out + t * q.out_ld + g * dh;
#pragma omp simd
      for (int64_t i = 0; i < dh; ++i) acc[i] *= inv;
    }
  }
}

void rope_rotate_half(float* x, int64_t dim, const float* cos_sin) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

}  // namespace xds::kernels

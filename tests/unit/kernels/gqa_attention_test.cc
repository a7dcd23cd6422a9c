// gqa_attention and rope_rotate_half against plain float64 references written from the
// definitions (softmax(scale · q·k) · v over the causal context; rotate_half).
#include "kernels/cpu/gqa_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/bf16.h"

namespace xds::kernels {
namespace {

struct PagedHead {  // one KV head's K and V planes in blocks of a storage, in a scrambled order
  int64_t block_size, head_dim, blocks;
  DType dtype;
  // per block: [K plane chunk | V plane chunk | (int8) K scales | V scales | padding]
  std::vector<std::byte> storage;
  std::vector<int32_t> table;  // position block -> storage block
  std::vector<double> k, v;    // [positions, head_dim] the values stored (after rounding)
  int64_t plane_bytes() const { return block_size * head_dim * dtype_size(dtype); }
  int64_t scale_bytes() const { return dtype == DType::kI8 ? block_size * 4 : 0; }
  int64_t block_bytes() const { return 2 * plane_bytes() + 2 * scale_bytes() + 64; }

  PagedHead(int64_t bs, int64_t dh, int64_t positions, DType dt, std::mt19937& rng)
      : block_size(bs), head_dim(dh), blocks((positions + bs - 1) / bs), dtype(dt) {
    storage.assign(static_cast<size_t>(blocks * block_bytes()), std::byte{0xff});
    for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>(blocks - 1 - b));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    k.resize(static_cast<size_t>(positions * dh));
    v.resize(k.size());
    const int64_t size = dtype_size(dtype);
    for (int64_t s = 0; s < positions; ++s) {
      std::byte* block = storage.data() + table[s / bs] * block_bytes();
      for (int plane = 0; plane < 2; ++plane) {
        std::vector<float> x(static_cast<size_t>(dh));
        for (float& e : x) e = nd(rng);
        std::byte* row = block + plane * plane_bytes() + (s % bs) * dh * size;
        double* stored = (plane == 0 ? k : v).data() + s * dh;
        if (dtype == DType::kI8) {  // absmax / 127 per row, round to nearest
          float amax = 0;
          for (float e : x) amax = std::max(amax, std::abs(e));
          const float scale = amax / 127.0f;
          std::memcpy(block + 2 * plane_bytes() + plane * scale_bytes() + (s % bs) * 4, &scale, 4);
          for (int64_t i = 0; i < dh; ++i) {
            const auto q = static_cast<int8_t>(std::lround(x[i] / scale));
            std::memcpy(row + i, &q, 1);
            stored[i] = static_cast<double>(static_cast<float>(q) * scale);
          }
          continue;
        }
        for (int64_t i = 0; i < dh; ++i) {
          float e = x[i];
          if (dtype == DType::kBF16) {
            const uint16_t h = f32_to_bf16(e);
            std::memcpy(row + i * 2, &h, 2);
            e = bf16_to_f32(h);
          } else {
            std::memcpy(row + i * 4, &e, 4);
          }
          stored[i] = e;
        }
      }
    }
  }

  GqaKvView view() const {
    GqaKvView w;
    w.base = storage.data();
    w.block_bytes = block_bytes();
    w.block_table = table.data();
    w.block_size = block_size;
    w.k_offset = 0;
    w.v_offset = plane_bytes();
    w.head_dim = head_dim;
    w.dtype = dtype;
    w.k_scale_offset = 2 * plane_bytes();
    w.v_scale_offset = 2 * plane_bytes() + scale_bytes();
    return w;
  }
};

// out[t, g] by the definition, in float64.
std::vector<double> reference(const PagedHead& kv, const std::vector<float>& q, int64_t m,
                              int64_t group, int64_t first_pos, double scale) {
  const int64_t dh = kv.head_dim;
  std::vector<double> out(static_cast<size_t>(m * group * dh), 0.0);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const float* qr = q.data() + (t * group + g) * dh;
      const int64_t n = first_pos + t + 1;
      std::vector<double> w(static_cast<size_t>(n));
      double mx = -INFINITY, sum = 0;
      for (int64_t s = 0; s < n; ++s) {
        double d = 0;
        for (int64_t i = 0; i < dh; ++i) d += double(qr[i]) * kv.k[s * dh + i];
        w[s] = d * scale;
        mx = std::max(mx, w[s]);
      }
      for (double& x : w) sum += x = std::exp(x - mx);
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t i = 0; i < dh; ++i)
          out[(t * group + g) * dh + i] += w[s] / sum * kv.v[s * dh + i];
      }
    }
  }
  return out;
}

void check(DType dtype, int64_t bs, int64_t dh, int64_t group, int64_t first_pos, int64_t m) {
  std::mt19937 rng(static_cast<uint32_t>(bs * 131 + dh * 7 + group * 3 + first_pos + m));
  PagedHead kv(bs, dh, first_pos + m, dtype, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(m * group * dh));
  for (float& x : q) x = nd(rng);
  std::vector<float> out(q.size(), NAN);
  std::vector<float> scratch(static_cast<size_t>(gqa_scratch_floats(m, group, bs, dh)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  GqaQueries gq{q.data(), group * dh, m, group, first_pos, scale, out.data(), group * dh};
  gqa_attention(gq, kv.view(), scratch.data());
  const std::vector<double> want = reference(kv, q, m, group, first_pos, scale);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], want[i], 2e-5 * (1 + std::abs(want[i])))
        << "dtype " << dtype_name(dtype) << " bs " << bs << " dh " << dh << " group " << group
        << " first_pos " << first_pos << " m " << m << " element " << i;
  }
}

TEST(GqaAttention, DecodeMatchesReferenceF32Bf16Int8) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI8}) {
    check(dt, 16, 128, 8, 0, 1);   // the first token: one row of context
    check(dt, 16, 128, 8, 40, 1);  // three blocks, the last partial
    check(dt, 4, 24, 3, 17, 1);    // head_dim not a multiple of the vector width
    check(dt, 16, 64, 1, 31, 1);   // MHA (group 1), context ends on a block edge
  }
}

TEST(GqaAttention, PrefillTileIsCausal) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI8}) {
    check(dt, 16, 128, 4, 0, 37);  // a whole prompt across blocks
    check(dt, 8, 48, 2, 13, 9);    // a chunk after cached context, straddling blocks
    check(dt, 3, 10, 5, 2, 7);     // odd sizes
  }
}

TEST(GqaAttention, RowDoesNotDependOnTileOrGroup) {
  // Token t of a prefill tile gives the same bits as that token alone (decode).
  std::mt19937 rng(7);
  PagedHead kv(16, 64, 30, DType::kF32, rng);
  const int64_t m = 10, group = 4, dh = 64, first_pos = 20;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(m * group * dh)), tile(q.size()), one(q.size());
  for (float& x : q) x = nd(rng);
  std::vector<float> scratch(static_cast<size_t>(gqa_scratch_floats(m, group, 16, dh)));
  gqa_attention({q.data(), group * dh, m, group, first_pos, 0.125f, tile.data(), group * dh},
                kv.view(), scratch.data());
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t at = (t * group + g) * dh;
      gqa_attention({q.data() + at, dh, 1, 1, first_pos + t, 0.125f, one.data() + at, dh},
                    kv.view(), scratch.data());
    }
  }
  EXPECT_EQ(0, std::memcmp(tile.data(), one.data(), sizeof(float) * tile.size()));
}

TEST(RopeRotateHalf, MatchesDefinition) {
  const int64_t dim = 10;
  std::vector<float> x(dim), cs(dim);
  for (int64_t i = 0; i < dim; ++i) x[i] = 0.5f + static_cast<float>(i);
  for (int64_t i = 0; i < dim / 2; ++i) {
    cs[2 * i] = std::cos(0.3f * (i + 1));
    cs[2 * i + 1] = std::sin(0.3f * (i + 1));
  }
  std::vector<float> y = x;
  rope_rotate_half(y.data(), dim, cs.data());
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double c = cs[2 * i], s = cs[2 * i + 1];
    EXPECT_NEAR(y[i], x[i] * c - x[i + dim / 2] * s, 1e-6);
    EXPECT_NEAR(y[i + dim / 2], x[i + dim / 2] * c + x[i] * s, 1e-6);
  }
}

}  // namespace
}  // namespace xds::kernels

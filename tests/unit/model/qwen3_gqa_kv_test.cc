// The GQA KV planes in a KvStorage: layout, rows written where the kernel's view reads them
// (f32 exactly, bf16 rounded to nearest even), blocks through a block table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "model/gqa_kv.h"
#include "model/kv_storage.h"

namespace xds {
namespace {

// Element i of KV head h of row (layer, block, slot) as the view addresses it.
float view_element(const KvStorage& kv, const kernels::GqaKvView& v, bool key, int32_t block,
                   int64_t slot, int64_t i) {
  const std::byte* row = v.base + block * v.block_bytes + (key ? v.k_offset : v.v_offset) +
                         (slot * v.head_dim + i) * dtype_size(v.dtype);
  if (v.dtype == DType::kBF16) {
    uint16_t b;
    std::memcpy(&b, row, 2);
    return bf16_to_f32(b);
  }
  (void)kv;
  float f;
  std::memcpy(&f, row, 4);
  return f;
}

TEST(GqaKv, LayoutIsKThenVPlanePerHead) {
  const KvLayout l = gqa_kv_layout(3, 4, 128, DType::kBF16);
  EXPECT_EQ(l.layers, 3);
  ASSERT_EQ(l.planes.size(), 8u);
  for (const KvPlane& p : l.planes) {
    EXPECT_EQ(p.dtype, DType::kBF16);
    EXPECT_EQ(p.elements, 128);
    EXPECT_EQ(p.row_bytes, 256);
  }
  EXPECT_TRUE(is_gqa_kv_layout(l));
  EXPECT_FALSE(is_gqa_kv_layout(mla_kv_layout(3, 512, 64, DType::kF32)));
}

TEST(GqaKv, WriteThenViewEveryHeadAndLayer) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t layers = 2, heads = 3, dh = 10, bs = 4;
    auto kv = KvStorage::create({gqa_kv_layout(layers, heads, dh, dt), 5, bs}, -1);
    ASSERT_TRUE(kv.ok()) << kv.status().message();
    // A sequence of 9 positions in blocks 4, 0, 2.
    const std::vector<int32_t> table = {4, 0, 2};
    auto value = [&](bool key, int64_t layer, int64_t pos, int64_t h, int64_t i) {
      return (key ? 1.0f : -1.0f) * (1.0f + 0.01f * i) * (1 + layer) +
             0.3f * static_cast<float>(pos) + 7.0f * static_cast<float>(h) + 1e-3f;
    };
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (int64_t p = 0; p < 9; ++p) {
        std::vector<float> k(heads * dh), v(heads * dh);
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t i = 0; i < dh; ++i) {
            k[h * dh + i] = value(true, layer, p, h, i);
            v[h * dh + i] = value(false, layer, p, h, i);
          }
        }
        gqa_kv_write(*kv, layer, table[p / bs], p % bs, k.data(), v.data());
      }
    }
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (int64_t h = 0; h < heads; ++h) {
        const kernels::GqaKvView view = gqa_kv_view(*kv, layer, h, table);
        EXPECT_EQ(view.dtype, dt);
        EXPECT_EQ(view.head_dim, dh);
        for (int64_t p = 0; p < 9; ++p) {
          for (int64_t i = 0; i < dh; ++i) {
            for (bool key : {true, false}) {
              float want = value(key, layer, p, h, i);
              if (dt == DType::kBF16) want = bf16_to_f32(f32_to_bf16(want));
              ASSERT_EQ(view_element(*kv, view, key, view.block_table[p / bs], p % bs, i), want)
                  << dtype_name(dt) << " layer " << layer << " head " << h << " pos " << p;
            }
          }
        }
      }
    }
  }
}

TEST(GqaKv, Int8RowsWithAScalePlanePerHead) {
  const int64_t layers = 2, heads = 2, dh = 8, bs = 4;
  const KvLayout l = gqa_kv_layout(layers, heads, dh, DType::kI8);
  ASSERT_EQ(l.planes.size(), 8u);  // K, K, V, V int8; then their scales
  for (size_t p = 0; p < 4; ++p) EXPECT_EQ(l.planes[p].dtype, DType::kI8);
  for (size_t p = 4; p < 8; ++p) EXPECT_EQ(l.planes[p].row_bytes, 4);
  EXPECT_TRUE(is_gqa_kv_layout(l));
  auto kv = KvStorage::create({l, 3, bs}, -1);
  ASSERT_TRUE(kv.ok()) << kv.status().message();
  const std::vector<int32_t> table = {2, 0};
  // Position 5 (block table[1] = 0, slot 1), layer 1: K head h row i = (h + 1) · (i - 3.5).
  std::vector<float> k(heads * dh), v(heads * dh);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < dh; ++i) {
      k[h * dh + i] = static_cast<float>((h + 1) * (i - 3.5));
      v[h * dh + i] = static_cast<float>(0.25 * (i + 1) * (h == 0 ? 1 : -1));
    }
  }
  gqa_kv_write(*kv, 1, table[1], 1, k.data(), v.data());
  for (int64_t h = 0; h < heads; ++h) {
    const kernels::GqaKvView view = gqa_kv_view(*kv, 1, h, table);
    ASSERT_EQ(view.dtype, DType::kI8);
    const std::byte* block = view.base + table[1] * view.block_bytes;
    float ks, vs;
    std::memcpy(&ks, block + view.k_scale_offset + 4, 4);
    std::memcpy(&vs, block + view.v_scale_offset + 4, 4);
    EXPECT_FLOAT_EQ(ks, (h + 1) * 3.5f / 127);  // absmax / 127
    EXPECT_FLOAT_EQ(vs, 2.0f / 127);
    for (int64_t i = 0; i < dh; ++i) {
      const auto kq = static_cast<int8_t>(block[view.k_offset + dh + i]);
      const auto vq = static_cast<int8_t>(block[view.v_offset + dh + i]);
      EXPECT_LE(std::abs(kq * ks - k[h * dh + i]), ks / 2 + 1e-6f);
      EXPECT_LE(std::abs(vq * vs - v[h * dh + i]), vs / 2 + 1e-6f);
    }
    EXPECT_EQ(static_cast<int8_t>(block[view.k_offset + dh]), -127);  // the absmax element
  }
}

}  // namespace
}  // namespace xds

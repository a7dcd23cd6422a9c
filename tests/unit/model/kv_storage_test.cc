#include "model/kv_storage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace xds {
namespace {

// Two layers of an MLA-like pair: latent 3 floats in rows of 64 bytes, rope 2 floats;
// blocks of 4 rows. By hand: latent chunk 4 · 64 = 256 bytes, rope chunk 4 · 8 = 32 -> 64
// (a line); a layer 320 bytes, a block 640, three blocks 1920.
KvStorageShape small_shape() {
  KvStorageShape s;
  s.layout.layers = 2;
  s.layout.planes = {{DType::kF32, 3, 64}, {DType::kF32, 2, 8}};
  s.num_blocks = 3;
  s.block_size = 4;
  return s;
}

TEST(KvStorage, BlockMajorLayoutAsDrawn) {
  const KvStorageShape shape = small_shape();
  EXPECT_EQ(KvStorage::bytes_for(shape), 1920);
  KvStorage kv = KvStorage::create(shape, -1).value();
  EXPECT_EQ(kv.block_bytes(), 640);
  EXPECT_EQ(kv.bytes(), 1920);
  EXPECT_TRUE(kv.is_mla());
  std::byte* base = kv.data();
  EXPECT_EQ(kv.block_ptr(2), base + 1280);
  EXPECT_EQ(kv.plane_ptr(1, 0, 0), base + 640);
  EXPECT_EQ(kv.plane_ptr(1, 0, 1), base + 640 + 256);
  EXPECT_EQ(kv.plane_ptr(1, 1, 0), base + 640 + 320);
  EXPECT_EQ(kv.plane_ptr(1, 1, 1), base + 640 + 320 + 256);
}

// Rows written through (layer, block, slot) are where the formula puts them, and where the
// kernels' view of a block table reads them.
TEST(KvStorage, WritesLandWhereTheViewReadsThem) {
  KvStorage kv = KvStorage::create(small_shape(), -1).value();
  const std::vector<int32_t> table = {2, 0};  // positions 0-3 in block 2, 4-7 in block 0
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t pos = 0; pos < 8; ++pos) {
      const float lat[3] = {float(layer * 100 + pos), float(pos) + 0.5f, -float(pos)};
      const float rope[2] = {float(layer), float(pos * 7)};
      kv.write(layer, table[pos / 4], pos % 4, lat, rope);
    }
  }
  for (int64_t layer = 0; layer < 2; ++layer) {
    const kernels::LatentKvView v = kv.view(layer, table);
    EXPECT_FALSE(v.bf16());
    EXPECT_EQ(v.latent_ld, 16);
    EXPECT_EQ(v.latent_block_stride, 160);  // 640 bytes / 4
    EXPECT_EQ(v.rope_block_stride, 160);
    for (int64_t pos = 0; pos < 8; ++pos) {
      const std::byte* row = kv.data() + table[pos / 4] * 640 + layer * 320 + (pos % 4) * 64;
      EXPECT_EQ(static_cast<const void*>(v.latent_at(pos)), static_cast<const void*>(row));
      EXPECT_EQ(v.latent_at(pos)[0], layer * 100 + pos);
      EXPECT_EQ(v.latent_at(pos)[1], pos + 0.5f);
      EXPECT_EQ(v.latent_at(pos)[2], -pos);
      const std::byte* rope_row =
          kv.data() + table[pos / 4] * 640 + layer * 320 + 256 + (pos % 4) * 8;
      EXPECT_EQ(static_cast<const void*>(v.rope_at(pos)), static_cast<const void*>(rope_row));
      EXPECT_EQ(v.rope_at(pos)[0], layer);
      EXPECT_EQ(v.rope_at(pos)[1], pos * 7);
    }
  }
  // Block 1 was never written: zero-filled.
  for (int64_t i = 0; i < 640; ++i) ASSERT_EQ(kv.block_ptr(1)[i], std::byte{0});
}

// copy_block copies every layer's planes of a block (copy on write), nothing else.
TEST(KvStorage, CopyBlockCopiesEveryLayer) {
  KvStorage kv = KvStorage::create(small_shape(), -1).value();
  for (int64_t i = 0; i < 640; ++i) kv.block_ptr(0)[i] = static_cast<std::byte>(i % 251 + 1);
  kv.copy_block(0, 2);
  EXPECT_EQ(std::memcmp(kv.block_ptr(0), kv.block_ptr(2), 640), 0);
  for (int64_t i = 0; i < 640; ++i) ASSERT_EQ(kv.block_ptr(1)[i], std::byte{0});
}

// The caller's memory: used in place; too small or misaligned is an error naming the sizes.
TEST(KvStorage, WrapsTheCallersMemory) {
  const KvStorageShape shape = small_shape();
  alignas(64) static std::byte memory[1920 + 64];
  KvStorage kv = KvStorage::wrap(shape, std::span(memory, 1920)).value();
  EXPECT_EQ(kv.data(), memory);
  const float lat[3] = {1, 2, 3}, rope[2] = {4, 5};
  kv.write(1, 2, 3, lat, rope);
  float got[3];
  std::memcpy(got, memory + 2 * 640 + 320 + 3 * 64, sizeof(got));
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[2], 3);

  const Result<KvStorage> small = KvStorage::wrap(shape, std::span(memory, 1919));
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("need 1920 bytes, the memory given has 1919"),
            std::string::npos)
      << small.status().message();
  const Result<KvStorage> odd = KvStorage::wrap(shape, std::span(memory + 8, 1920));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("not 64-byte aligned"), std::string::npos);
}

// The INT8 latent: int8 latent [512] in rows of 576 bytes (8 lines padded to 9), an f32
// scale per row, bf16 rope [64]. Blocks of 16: 9216 + 64 + 2048 bytes a layer, by hand.
TEST(KvStorage, AnInt8LatentWithAScalePerRowIsALayoutToo) {
  KvStorageShape s;
  s.layout.layers = 3;
  s.layout.planes = {{DType::kI8, 512, 576}, {DType::kF32, 1, 4}, {DType::kBF16, 64, 128}};
  s.num_blocks = 2;
  s.block_size = 16;
  const KvLayout made = mla_int8_kv_layout(3, 512, 64, DType::kBF16);
  ASSERT_EQ(made.planes.size(), 3u);
  for (size_t p = 0; p < 3; ++p) {
    EXPECT_EQ(made.planes[p].dtype, s.layout.planes[p].dtype) << p;
    EXPECT_EQ(made.planes[p].elements, s.layout.planes[p].elements) << p;
    EXPECT_EQ(made.planes[p].row_bytes, s.layout.planes[p].row_bytes) << p;
  }
  EXPECT_EQ(KvStorage::bytes_for(s), 2 * 3 * (9216 + 64 + 2048));
  KvStorage kv = KvStorage::create(s, -1).value();
  EXPECT_TRUE(kv.is_mla());
  EXPECT_TRUE(kv.is_int8());
  EXPECT_EQ(kv.block_bytes(), 3 * 11328);
  EXPECT_EQ(kv.plane_ptr(1, 2, 1), kv.data() + 3 * 11328 + 2 * 11328 + 9216);
  EXPECT_EQ(kv.plane_ptr(1, 2, 2), kv.data() + 3 * 11328 + 2 * 11328 + 9216 + 64);
}

// Rows written to an INT8 cache read back through the view as the quantization rule says,
// computed here independently: s = absmax / 127, q = nearest-even(x / s), a zero row all
// zeros with s = 0; x' = q · s within s / 2 (1 + 2^-14) of x; the rope part exact (f32).
// Two layers, blocks of 3 rows in a permuted table, dims that fill no line exactly.
TEST(KvStorage, Int8RowsRoundTripThroughTheView) {
  const int64_t lat = 37, dr = 5, bs = 3;
  KvStorageShape s{mla_int8_kv_layout(2, lat, dr, DType::kF32), 4, bs};
  KvStorage kv = KvStorage::create(s, -1).value();
  ASSERT_TRUE(kv.is_int8());
  const std::vector<int32_t> table = {3, 1, 0, 2};
  const int64_t ctx = 10;
  std::vector<float> lat_rows(static_cast<size_t>(2 * ctx * lat)),
      rope_rows(static_cast<size_t>(2 * ctx * dr));
  uint32_t state = 12345;
  auto next = [&] {  // a plain LCG in [-4, 4)
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
  };
  for (float& x : lat_rows) x = next();
  for (float& x : rope_rows) x = next();
  for (int64_t c = 0; c < lat; ++c) lat_rows[static_cast<size_t>((1 * ctx + 4) * lat + c)] = 0;
  lat_rows[static_cast<size_t>(7 * lat + 2)] = 1000.0f;  // one outlier sets its row's scale
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int64_t pos = 0; pos < ctx; ++pos)
      kv.write(layer, table[pos / bs], pos % bs, &lat_rows[(layer * ctx + pos) * lat],
               &rope_rows[(layer * ctx + pos) * dr]);
  for (int64_t layer = 0; layer < 2; ++layer) {
    const kernels::LatentKvView v = kv.view(layer, table);
    ASSERT_TRUE(v.int8());
    EXPECT_EQ(v.latent_ld, 64);
    std::vector<float> deq(static_cast<size_t>(ctx * lat)), rope(static_cast<size_t>(ctx * dr));
    kernels::dequantize_int8_kv_rows(v, 0, ctx, deq.data(), lat, rope.data());
    for (int64_t pos = 0; pos < ctx; ++pos) {
      const float* x = &lat_rows[(layer * ctx + pos) * lat];
      float amax = 0.0f;
      for (int64_t c = 0; c < lat; ++c) amax = std::max(amax, std::fabs(x[c]));
      const float scale = amax / 127.0f;
      ASSERT_EQ(v.latent_scale_at(pos), scale) << layer << "," << pos;
      for (int64_t c = 0; c < lat; ++c) {
        const int want = scale == 0.0f ? 0 : static_cast<int>(std::nearbyint(x[c] / scale));
        ASSERT_EQ(v.latent8_at(pos)[c], want) << layer << "," << pos << "," << c;
        ASSERT_LE(std::fabs(deq[pos * lat + c] - x[c]), scale / 2 * (1 + 1.0 / 16384));
      }
      for (int64_t c = 0; c < dr; ++c)
        ASSERT_EQ(rope[pos * dr + c], rope_rows[(layer * ctx + pos) * dr + c]);
    }
  }
  // Blocks are bytes: a copied block reads back the same rows.
  kv.copy_block(table[0], table[3]);
  const std::vector<int32_t> copied = {table[3]};
  const kernels::LatentKvView a = kv.view(1, table), b = kv.view(1, copied);
  for (int64_t pos = 0; pos < bs; ++pos) {
    EXPECT_EQ(a.latent_scale_at(pos), b.latent_scale_at(pos));
    EXPECT_EQ(std::memcmp(a.latent8_at(pos), b.latent8_at(pos), lat), 0);
  }
}

TEST(KvStorage, MlaLayoutPadsTheLatentRows) {
  const KvLayout f32 = mla_kv_layout(4, 512, 64, DType::kF32);
  ASSERT_EQ(f32.planes.size(), 2u);
  EXPECT_EQ(f32.planes[0].row_bytes, 528 * 4);  // 32 lines padded to 33
  EXPECT_EQ(f32.planes[1].row_bytes, 64 * 4);
  const KvLayout bf16 = mla_kv_layout(4, 512, 64, DType::kBF16);
  EXPECT_EQ(bf16.planes[0].row_bytes, 544 * 2);  // 16 lines padded to 17
  KvStorageShape s{bf16, 2, 16};
  KvStorage kv = KvStorage::create(s, -1).value();
  const std::vector<int32_t> table = {1};
  const kernels::LatentKvView v = kv.view(3, table);
  EXPECT_TRUE(v.bf16());
  EXPECT_EQ(v.latent_ld, 544);
  EXPECT_EQ(v.latent_block_stride, kv.block_bytes() / 2);
  EXPECT_EQ(static_cast<const void*>(v.latent16_at(0)),
            static_cast<const void*>(kv.data() + kv.block_bytes() + 3 * (16 * 1088 + 16 * 128)));
}

TEST(KvStorage, BadShapesAreClearErrors) {
  KvStorageShape s = small_shape();
  s.layout.planes[0].row_bytes = 10;  // not a multiple of 4
  Result<KvStorage> r = KvStorage::create(s, -1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("plane 0"), std::string::npos) << r.status().message();
  s = small_shape();
  s.layout.planes[1].row_bytes = 4;  // 2 floats do not fit
  EXPECT_NE(KvStorage::create(s, -1).status().message().find("plane 1"), std::string::npos);
  s = small_shape();
  s.num_blocks = 0;
  EXPECT_NE(KvStorage::create(s, -1).status().message().find("blocks 0"), std::string::npos);
  s = small_shape();
  s.num_blocks = int64_t{1} << 40;
  s.block_size = int64_t{1} << 30;
  EXPECT_EQ(KvStorage::bytes_for(s), -1);
  s = small_shape();
  EXPECT_EQ(KvStorage::create(s, 1919).status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace xds

// LatentKvView's block strides: the same cached rows laid out block-major, as a cache
// [block][layer][plane][block_size rows] keeps them (each block's planes of one layer between
// the other layers' planes), give the bits of the compact planes [num_blocks, block_size, ld]
// on every path of the absorbed kernel: fp32 products (pointer-per-row and strided 16-row
// tiles), bf16 products over fp32 planes and over bf16 planes (read in place, or copied for
// odd widths), parts that start and end inside blocks, and the next-rows prefetch hint. The
// other layers' rows and every row's padding hold NaN: a kernel that reads them fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absorbed_parts.h"
#include "isa_for_tests.h"
#include "kernels/cpu/mla_attention.h"

namespace xds::kernels {
namespace {

constexpr int64_t kLayers = 3, kLayer = 1;  // the view's layer among kLayers

// Compact planes (latent [blocks, bs, ld], rope [blocks, bs, dr]) copied into one
// block-major buffer [blocks][kLayers][latent bs·ld, rope bs·dr], the rows at layer kLayer,
// every other layer's planes `garbage`.
template <typename T>
std::vector<T> block_major(const std::vector<T>& latent, const std::vector<T>& rope, int64_t blocks,
                           int64_t bs, int64_t ld, int64_t dr, T garbage) {
  const int64_t layer_size = bs * (ld + dr);
  std::vector<T> buf(static_cast<size_t>(blocks * kLayers * layer_size), garbage);
  for (int64_t b = 0; b < blocks; ++b) {
    T* at = buf.data() + (b * kLayers + kLayer) * layer_size;
    std::memcpy(at, latent.data() + b * bs * ld, sizeof(T) * static_cast<size_t>(bs * ld));
    std::memcpy(at + bs * ld, rope.data() + b * bs * dr, sizeof(T) * static_cast<size_t>(bs * dr));
  }
  return buf;
}

// The view of kLayer in a block_major buffer (latent and rope pointers into it, strides
// spanning all layers).
void set_block_major(LatentKvView& v, int64_t bs, int64_t ld, int64_t dr) {
  v.latent_block_stride = v.rope_block_stride = kLayers * bs * (ld + dr);
}

TEST(MlaBlockStride, RowAddressesFollowTheStrides) {
  const std::vector<int32_t> table = {3, 0, 2};
  std::vector<float> plane(4096);
  LatentKvView kv{plane.data(), plane.data() + 100, table.data(), 4, 6, 2, 8};
  // Defaults: compact planes, hand-derived. Position 5: block table[1] = 0, slot 1.
  EXPECT_EQ(kv.latent_at(5), plane.data() + 1 * 8);
  EXPECT_EQ(kv.rope_at(5), plane.data() + 100 + 1 * 2);
  // Position 2: block 3, slot 2: 3·4·8 + 2·8 and 100 + 3·4·2 + 2·2.
  EXPECT_EQ(kv.latent_at(2), plane.data() + 112);
  EXPECT_EQ(kv.rope_at(2), plane.data() + 128);
  kv.latent_block_stride = 1000, kv.rope_block_stride = 70;
  EXPECT_EQ(kv.latent_at(2), plane.data() + 3000 + 16);
  EXPECT_EQ(kv.rope_at(2), plane.data() + 100 + 210 + 4);
  EXPECT_EQ(kv.latent_at(9), plane.data() + 2000 + 8);  // block table[2] = 2, slot 1
  EXPECT_EQ(kv.rope_at(9), plane.data() + 100 + 140 + 2);
}

struct Shape {
  int64_t lat, dr, ld, bs, heads;
};

TEST(MlaBlockStride, BlockMajorCacheGivesTheBitsOfCompactPlanes) {
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const float nan = std::nanf("");
  const uint16_t nan16 = 0x7fc0;
  const int64_t ctx = 300;
  // DeepSeek-V3's shape (C = 512 in rows of 528, Dr = 64: the strided 16-row tiles, bf16
  // planes read in place); blocks of 5 (tiles of bf16 planes cut at every block edge, runs
  // of strided rows end there); odd widths (bf16 rows copied) in padded rows.
  const Shape shapes[] = {{512, 64, padded_latent_stride(512), 16, 16},
                          {48, 8, 48, 5, 11},
                          {31, 7, padded_latent_stride(31), 16, 20}};
  const std::vector<std::vector<int64_t>> cuts = {{0, ctx}, {0, 100, 257, ctx}, {0, 37}};
  const IsaGuard guard;
  for (const Shape& sh : shapes) {
    const int64_t blocks = (ctx + sh.bs - 1) / sh.bs + 4;
    const std::vector<int32_t> table = permuted_block_table(blocks, blocks % 7 ? 7 : 11, 3);
    const int64_t rows = blocks * sh.bs, ld16 = sh.ld;  // bf16 rows: the same strides
    std::vector<float> latent(static_cast<size_t>(rows * sh.ld), nan),
        rope(static_cast<size_t>(rows * sh.dr));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < sh.lat; ++c) latent[r * sh.ld + c] = d(rng);
    for (float& x : rope) x = d(rng);
    std::vector<uint16_t> latent16(static_cast<size_t>(rows * ld16), nan16),
        rope16(static_cast<size_t>(rows * sh.dr));
    const bool bf16 = absorbed_bf16_available();
    if (bf16) {
      for (int64_t r = 0; r < rows; ++r) {
        kv_row_to_bf16(latent.data() + r * sh.ld, sh.lat, latent16.data() + r * ld16);
        kv_row_to_bf16(rope.data() + r * sh.dr, sh.dr, rope16.data() + r * sh.dr);
      }
    }
    const std::vector<float> major = block_major(latent, rope, blocks, sh.bs, sh.ld, sh.dr, nan);
    const std::vector<uint16_t> major16 =
        block_major(latent16, rope16, blocks, sh.bs, ld16, sh.dr, nan16);
    const int64_t at = kLayer * sh.bs * (sh.ld + sh.dr);  // the layer's latent plane in a block
    const int64_t rope_at = at + sh.bs * sh.ld;

    const LatentKvView compact{latent.data(), rope.data(), table.data(), sh.bs,
                               sh.lat,        sh.dr,       sh.ld};
    LatentKvView strided{
        major.data() + at, major.data() + rope_at, table.data(), sh.bs, sh.lat, sh.dr, sh.ld};
    set_block_major(strided, sh.bs, sh.ld, sh.dr);
    LatentKvView compact16{nullptr, nullptr, table.data(), sh.bs, sh.lat, sh.dr, ld16};
    compact16.latent16 = latent16.data(), compact16.rope16 = rope16.data();
    LatentKvView strided16{nullptr, nullptr, table.data(), sh.bs, sh.lat, sh.dr, ld16};
    strided16.latent16 = major16.data() + at, strided16.rope16 = major16.data() + rope_at;
    set_block_major(strided16, sh.bs, ld16, sh.dr);

    std::vector<float> q_abs(static_cast<size_t>(sh.heads * sh.lat)),
        q_pe(static_cast<size_t>(sh.heads * sh.dr));
    for (auto* v : {&q_abs, &q_pe})
      for (float& x : *v) x = d(rng);
    const float scale = 0.1f;
    for (const PanelIsa isa : available_isas()) {
      set_panel_isa(isa);
      for (const bool products16 : {false, true}) {
        if (products16 && !absorbed_bf16_available()) continue;
        for (const bool planes16 : {false, true}) {
          if (planes16 && !products16) continue;  // bf16 planes: bf16 products only
          const LatentKvView& a = planes16 ? compact16 : compact;
          const LatentKvView& b = planes16 ? strided16 : strided;
          AbsorbedQuery q{q_abs.data(), sh.lat, q_pe.data(), sh.dr, nullptr, sh.lat};
          q.bf16 = products16;
          for (const auto& cut : cuts) {
            const std::vector<float> want = attend_in_parts(q, sh.heads, a, cut, scale);
            const std::vector<float> got = attend_in_parts(q, sh.heads, b, cut, scale);
            ASSERT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * want.size()), 0)
                << panel_isa_name(isa) << " lat=" << sh.lat << " bs=" << sh.bs << " bf16 products "
                << products16 << " bf16 planes " << planes16 << " parts=" << cut.size() - 1
                << " ctx=" << cut.back();
            for (const float x : got) ASSERT_FALSE(std::isnan(x));
          }
          // The whole context with a next-rows hint into the block-major planes (the
          // prefetch walks them too): still the compact planes' bits.
          std::vector<float> want(static_cast<size_t>(sh.heads * sh.lat)), got(want.size());
          q.out = want.data();
          mla_absorbed_attention(q, 0, sh.heads, a, ctx, scale);
          q.out = got.data();
          const AbsorbedNextRows hint{b, 3, ctx};
          mla_absorbed_attention(q, 0, sh.heads, b, ctx, scale, &hint);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * want.size()), 0)
              << panel_isa_name(isa) << " lat=" << sh.lat << " bs=" << sh.bs << " bf16 products "
              << products16 << " bf16 planes " << planes16 << " (whole, hinted)";
        }
      }
    }
  }
}

}  // namespace
}  // namespace xds::kernels

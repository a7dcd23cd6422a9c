#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include <vector>

#include "../kernels/isa_for_tests.h"

namespace xds {
namespace {

TEST(KvCache, BlocksAreReservedFreedAndExhaustedWithAClearError) {
  KvCache cache = KvCache::create({/*layers=*/2, /*num_blocks=*/4, /*block_size=*/4,
                                   /*latent_dim=*/3, /*rope_dim=*/2})
                      .value();
  const int64_t a = cache.add_sequence(), b = cache.add_sequence();
  ASSERT_TRUE(cache.reserve(a, 5).ok());  // 2 blocks
  EXPECT_EQ(cache.capacity(a), 8);
  ASSERT_TRUE(cache.reserve(b, 8).ok());  // 2 blocks
  const Status full = cache.reserve(a, 9);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("1 more blocks"), std::string::npos) << full.message();
  // Writes through the block table land where the view reads them; rows are padded
  // (latent_ld > latent_dim) and writing a whole row leaves its neighbours be.
  for (int64_t pos = 0; pos < 8; ++pos) {
    const float lat[3] = {float(pos * 3), float(pos * 3 + 1), float(pos * 3 + 2)};
    const float rope[2] = {float(-pos), float(pos + 100)};
    if (pos < 5) cache.write(1, a, pos, lat, rope);
    const float other_lat[3] = {float(-pos), float(pos + 100), 7.0f};
    const float other_rope[2] = {float(pos * 3), float(pos * 3 + 1)};
    cache.write(1, b, pos, other_lat, other_rope);
  }
  const auto view = cache.view(1, a), other = cache.view(1, b);
  EXPECT_FALSE(view.bf16());
  EXPECT_EQ(view.latent_ld, 16);  // 3 floats: one line
  for (int64_t pos = 0; pos < 5; ++pos) {
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(view.latent_at(pos)[c], pos * 3 + c);
    EXPECT_EQ(view.rope_at(pos)[0], -pos);
    EXPECT_EQ(view.rope_at(pos)[1], pos + 100);
  }
  for (int64_t pos = 0; pos < 8; ++pos) {
    EXPECT_EQ(other.latent_at(pos)[0], -pos);
    EXPECT_EQ(other.latent_at(pos)[1], pos + 100);
    EXPECT_EQ(other.latent_at(pos)[2], 7.0f);
    EXPECT_EQ(other.rope_at(pos)[0], pos * 3);
    EXPECT_EQ(other.rope_at(pos)[1], pos * 3 + 1);
  }
  cache.free_sequence(b);
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_TRUE(cache.reserve(a, 16).ok());
}

// MTP rollback: truncate gives back exactly the blocks past the kept length, and the kept
// rows are untouched.
TEST(KvCache, TruncateGivesBackTheBlocksPastTheKeptLength) {
  KvCache cache = KvCache::create({/*layers=*/1, /*num_blocks=*/6, /*block_size=*/4,
                                   /*latent_dim=*/3, /*rope_dim=*/2})
                      .value();
  const int64_t a = cache.add_sequence();
  ASSERT_TRUE(cache.reserve(a, 13).ok());  // 4 blocks
  for (int64_t pos = 0; pos < 6; ++pos) {
    const float lat[3] = {float(pos), 1, 2}, rope[2] = {3, 4};
    cache.write(0, a, pos, lat, rope);
  }
  const std::vector<int32_t> before(cache.blocks(a).begin(), cache.blocks(a).end());
  cache.truncate(a, 6);  // positions 0..5: blocks 0 and 1
  EXPECT_EQ(cache.capacity(a), 8);
  EXPECT_EQ(cache.free_blocks(), 4);
  EXPECT_EQ(std::vector<int32_t>(cache.blocks(a).begin(), cache.blocks(a).end()),
            std::vector<int32_t>(before.begin(), before.begin() + 2));
  for (int64_t pos = 0; pos < 6; ++pos) EXPECT_EQ(cache.view(0, a).latent_at(pos)[0], pos);
  cache.truncate(a, 8);  // a whole block: nothing to give back
  EXPECT_EQ(cache.capacity(a), 8);
  cache.truncate(a, 20);  // past the capacity: nothing either
  EXPECT_EQ(cache.capacity(a), 8);
  cache.truncate(a, 0);
  EXPECT_EQ(cache.capacity(a), 0);
  EXPECT_EQ(cache.free_blocks(), 6);
  cache.allocator().check_invariants();
}

// A bf16 cache stores each value rounded to nearest even (the absorbed kernel's rounding of
// the rows it reads), denormals flushed to zero; values derived by hand from the formats.
TEST(KvCache, Bf16PlanesHoldTheRoundedRows) {
  if (!kernels::absorbed_bf16_available()) GTEST_SKIP() << "no AVX512_BF16 attention kernel";
  KvCacheShape shape{/*layers=*/2, /*num_blocks=*/3, /*block_size=*/4, /*latent_dim=*/6,
                     /*rope_dim=*/2};
  shape.dtype = DType::kBF16;
  KvCache cache = KvCache::create(shape).value();
  const int64_t seq = cache.add_sequence();
  ASSERT_TRUE(cache.reserve(seq, 6).ok());
  const float lat[6] = {
      1.0f,
      1.00390625f,             // 1 + 2^-8: halfway between 0x3F80 and 0x3F81, to even 0x3F80
      1.01171875f,             // 1 + 3 * 2^-8: halfway, to even 0x3F82
      1.00390625f + 0x1p-20f,  // just above halfway: 0x3F81
      -2.5f,                   // exact: 0xC020
      1e-40f,                  // denormal: flushed to +0
  };
  const float rope[2] = {65536.0f, -0.0f};  // 0x4780, 0x8000
  for (int64_t pos = 0; pos < 6; ++pos) cache.write(1, seq, pos, lat, rope);
  const auto view = cache.view(1, seq);
  ASSERT_TRUE(view.bf16());
  EXPECT_EQ(view.latent, nullptr);
  EXPECT_EQ(view.latent_ld, 32);  // 6 bf16: one line of 32
  const uint16_t want[6] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x0000};
  for (int64_t pos = 0; pos < 6; ++pos) {
    for (int c = 0; c < 6; ++c) EXPECT_EQ(view.latent16_at(pos)[c], want[c]) << pos << " " << c;
    EXPECT_EQ(view.rope16_at(pos)[0], 0x4780);
    EXPECT_EQ(view.rope16_at(pos)[1], 0x8000);
  }
  EXPECT_EQ(view.latent16_at(5) - view.latent16_at(4), 32);  // same block, padded stride
}

TEST(KvCache, ABf16CacheWithoutItsKernelIsAClearError) {
  const kernels::IsaGuard guard;
  kernels::set_panel_isa(kernels::PanelIsa::kAvx2);  // the bf16 attention kernel is AVX-512
  KvCacheShape shape{2, 3, 4, 6, 2};
  shape.dtype = DType::kBF16;
  const Result<KvCache> r = KvCache::create(shape);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("AVX512_BF16"), std::string::npos) << r.status().message();
  shape.dtype = DType::kF16;
  const Result<KvCache> f16 = KvCache::create(shape);
  ASSERT_FALSE(f16.ok());
  EXPECT_NE(f16.status().message().find("dtype F16"), std::string::npos) << f16.status().message();
}

TEST(KvCache, BytesAreBothPlanesOfEveryLayer) {
  // 3 layers x 5 blocks x 16 tokens, rows of 528 (512 padded to an odd number of lines)
  // + 64 floats: 240 rows of 592 floats.
  const KvCacheShape shape{3, 5, 16, 512, 64};
  EXPECT_EQ(KvCache::bytes_for(shape), int64_t{240} * 592 * 4);
  EXPECT_EQ(KvCache::bytes_for({61, int64_t{1} << 50, 16, 512, 64}), -1);  // overflows
  // bf16: rows of 544 (1024 bytes, 16 lines, padded to 17) + 64 elements of 2 bytes.
  KvCacheShape bf16 = shape;
  bf16.dtype = DType::kBF16;
  EXPECT_EQ(KvCache::bytes_for(bf16), int64_t{240} * 608 * 2);
}

TEST(KvCache, ACacheBeyondTheAvailableMemoryIsAClearError) {
  const KvCacheShape shape{3, 5, 16, 512, 64};
  const int64_t bytes = KvCache::bytes_for(shape);
  ASSERT_TRUE(KvCache::create(shape, bytes).ok());
  const Result<KvCache> too_big = KvCache::create(shape, bytes - 1);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = too_big.status().message();
  EXPECT_NE(m.find("KV cache for 80 tokens x 3 layers needs"), std::string::npos) << m;
  EXPECT_NE(m.find("GiB of memory is available"), std::string::npos) << m;
  // Past int64: refused before any arithmetic wraps, whatever the memory.
  const Result<KvCache> absurd = KvCache::create({61, int64_t{1} << 50, 16, 512, 64}, -1);
  ASSERT_FALSE(absurd.ok());
  EXPECT_EQ(absurd.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(absurd.status().message().find("more than 2^63 bytes"), std::string::npos);
  // Bad shapes name the fields.
  const Result<KvCache> empty = KvCache::create({2, 0, 16, 512, 64}, -1);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("blocks 0"), std::string::npos);
}

}  // namespace
}  // namespace xds

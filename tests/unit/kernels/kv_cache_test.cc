#include "model/kv_cache.h"

#include <gtest/gtest.h>

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
  // Writes through the block table land where the view reads them.
  for (int64_t pos = 0; pos < 5; ++pos)
    cache.latent_slot(1, a, pos)[2] = static_cast<float>(pos + 10);
  const auto view = cache.view(1, a);
  for (int64_t pos = 0; pos < 5; ++pos) EXPECT_EQ(view.latent_at(pos)[2], pos + 10);
  // Rows are padded (latent_ld > latent_dim): writing a whole row leaves its neighbours be.
  const auto padded = cache.view(1, b);
  EXPECT_EQ(padded.latent_ld, 16);  // 3 floats: one line
  for (int64_t pos = 0; pos < 8; ++pos)
    for (int64_t c = 0; c < 3; ++c)
      cache.latent_slot(1, b, pos)[c] = static_cast<float>(pos * 3 + c);
  for (int64_t pos = 0; pos < 8; ++pos)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(padded.latent_at(pos)[c], pos * 3 + c);
  cache.free_sequence(b);
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_TRUE(cache.reserve(a, 16).ok());
}

TEST(KvCache, BytesAreBothPlanesOfEveryLayer) {
  // 3 layers x 5 blocks x 16 tokens, rows of 528 (512 padded to an odd number of lines)
  // + 64 floats: 240 rows of 592 floats.
  const KvCacheShape shape{3, 5, 16, 512, 64};
  EXPECT_EQ(KvCache::bytes_for(shape), int64_t{240} * 592 * 4);
  EXPECT_EQ(KvCache::bytes_for({61, int64_t{1} << 50, 16, 512, 64}), -1);  // overflows
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

#include "model/kv_cache.h"

#include <gtest/gtest.h>

namespace xds {
namespace {

TEST(KvCache, BlocksAreReservedFreedAndExhaustedWithAClearError) {
  KvCache cache(
      {/*layers=*/2, /*num_blocks=*/4, /*block_size=*/4, /*latent_dim=*/3, /*rope_dim=*/2});
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

}  // namespace
}  // namespace xds

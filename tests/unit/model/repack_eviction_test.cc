// The repack cache's eviction: the pure choice (model/repack_eviction.h) on hand-made
// listings, then RepackCache removing the least recently used files under XDS_CACHE_MAX_GB.
#include "model/repack_eviction.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "model/weights.h"
#include "test_files.h"

namespace xds {
namespace {

using Names = std::vector<std::string>;

const std::vector<RepackFile> kFiles = {
    {"a.xrp", 100, 30}, {"b.xrp", 200, 10}, {"c.xrb", 300, 20}, {"d.xrp", 50, 10}};
// Oldest first: b and d (10; by name: b, d), then c (20), then a (30).

TEST(RepackEviction, NothingWhileBothLimitsHold) {
  RepackLimits l;
  l.folder_limit = 650 + 100;  // 650 held + 100 incoming fit exactly
  l.disk_free = 1000;
  l.keep_free = 900;  // 1000 - 100 = 900 left free: holds
  EXPECT_EQ(choose_repack_evictions(kFiles, 100, l, {}), Names{});
}

TEST(RepackEviction, OldestFirstUntilTheFolderFits) {
  RepackLimits l;
  l.folder_limit = 500;  // 650 + 100 incoming: 250 over -> b (200) and d (50)
  EXPECT_EQ(choose_repack_evictions(kFiles, 100, l, {}), (Names{"b.xrp", "d.xrp"}));
  l.folder_limit = 499;  // 251 over: c too
  EXPECT_EQ(choose_repack_evictions(kFiles, 100, l, {}), (Names{"b.xrp", "d.xrp", "c.xrb"}));
}

TEST(RepackEviction, TheDiskRuleAloneCanEvict) {
  RepackLimits l;
  l.disk_free = 400;
  l.keep_free = 350;  // 350 + 100 incoming - 400 free = 50 to free: b alone
  EXPECT_EQ(choose_repack_evictions(kFiles, 100, l, {}), Names{"b.xrp"});
}

TEST(RepackEviction, FilesInUseAreNeverChosenEvenWhenThatIsNotEnough) {
  RepackLimits l;
  l.folder_limit = 0;
  EXPECT_EQ(choose_repack_evictions(kFiles, 1, l, {"b.xrp", "c.xrb"}),
            (Names{"d.xrp", "a.xrp"}));
}

class RepackCacheEviction : public xds::testing::TempDirTest {
 protected:
  void TearDown() override {
    ::unsetenv("XDS_CACHE_MAX_GB");
    TempDirTest::TearDown();
  }
  RepackOptions opts() const {
    RepackOptions o;
    o.dir = path("cache");
    o.progress = false;
    return o;
  }
  // A 4 KB payload under `key` through a fresh cache (another process, as far as it knows).
  Status write(const std::string& key) {
    RepackCache cache(opts());
    return cache.get_or_create(key, 4096, [](std::byte* d) -> Status {
      std::fill(d, d + 4096, std::byte{1});
      return {};
    }).status();
  }
  void set_mtime(const std::string& key, int64_t seconds) {
    RepackCache cache(opts());
    const timespec t[2] = {{seconds, 0}, {seconds, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, cache.path_for_key(key).c_str(), t, 0), 0);
  }
  bool exists(const std::string& key) {
    RepackCache cache(opts());
    return std::filesystem::exists(cache.path_for_key(key));
  }
};

TEST_F(RepackCacheEviction, TheLeastRecentlyUsedFileMakesRoomUnderTheLimit) {
  for (const char* k : {"one", "two", "three"}) ASSERT_TRUE(write(k).ok());
  set_mtime("one", 3000);
  set_mtime("two", 1000);  // the oldest
  set_mtime("three", 2000);
  // Room for three files of ~4.1 KB (payload and header) but not four.
  ::setenv("XDS_CACHE_MAX_GB", fmt::format("{}", 3.5 * 4160 / double(1 << 30)).c_str(), 1);
  ASSERT_TRUE(write("four").ok());
  EXPECT_FALSE(exists("two"));
  EXPECT_TRUE(exists("one"));
  EXPECT_TRUE(exists("three"));
  EXPECT_TRUE(exists("four"));
}

TEST_F(RepackCacheEviction, AReusedFileCountsAsRecentlyUsed) {
  for (const char* k : {"one", "two"}) ASSERT_TRUE(write(k).ok());
  set_mtime("one", 1000);
  set_mtime("two", 2000);
  ASSERT_TRUE(write("one").ok());  // reused: its mtime is now
  ::setenv("XDS_CACHE_MAX_GB", fmt::format("{}", 2.5 * 4160 / double(1 << 30)).c_str(), 1);
  ASSERT_TRUE(write("three").ok());
  EXPECT_TRUE(exists("one"));
  EXPECT_FALSE(exists("two"));
}

TEST_F(RepackCacheEviction, AMalformedLimitIsAnErrorNamingIt) {
  ::setenv("XDS_CACHE_MAX_GB", "12GB", 1);
  const Status st = write("one");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("XDS_CACHE_MAX_GB='12GB'"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace xds

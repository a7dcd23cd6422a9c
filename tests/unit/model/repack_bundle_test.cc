// RepackCache::bind_bundle (model/repack_bundle.h): a group of payloads in one file, mapped
// as one 2 MB-aligned range, reused without refilling, rebuilt from the first difference.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/weights.h"
#include "test_files.h"

namespace xds {
namespace {

// A payload: its key, its size, and the byte at every position (a function of both, so a
// payload read at another's offset or from a stale file shows).
struct Payload {
  std::string key;
  size_t bytes;
  uint8_t seed;
  std::byte at(size_t i) const { return static_cast<std::byte>((i * 31 + seed) & 0xff); }
};

class RepackBundleTest : public xds::testing::TempDirTest {
 protected:
  RepackOptions opts() const {
    RepackOptions o;
    o.dir = path("cache");
    o.progress = false;
    return o;
  }
  std::vector<std::string> cache_files(const std::string& suffix = "") const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_ / "cache")) {
      const std::string name = e.path().filename().string();
      if (suffix.empty() || name.ends_with(suffix)) out.push_back(name);
    }
    return out;
  }
  // Binds `payloads` in one bundle through `cache`; counts the fills; returns the pointers.
  std::vector<const std::byte*> bind(RepackCache& cache, const std::vector<Payload>& payloads,
                                     int* fills, Status* status = nullptr) {
    std::vector<const std::byte*> out;
    const Status st = cache.bind_bundle("layers.3.experts", [&]() -> Status {
      for (const Payload& p : payloads) {
        XDS_ASSIGN_OR_RETURN(const std::byte* q,
                             cache.get_or_create(p.key, p.bytes, [&](std::byte* dst) -> Status {
                               ++*fills;
                               for (size_t i = 0; i < p.bytes; ++i) dst[i] = p.at(i);
                               return {};
                             }));
        out.push_back(q);
      }
      return {};
    });
    if (status != nullptr) {
      *status = st;
    } else {
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    return out;
  }
  static void expect_contents(const std::vector<Payload>& payloads,
                              const std::vector<const std::byte*>& at) {
    ASSERT_EQ(at.size(), payloads.size());
    for (size_t k = 0; k < payloads.size(); ++k) {
      size_t wrong = 0;
      for (size_t i = 0; i < payloads[k].bytes; ++i) wrong += at[k][i] != payloads[k].at(i);
      EXPECT_EQ(wrong, 0u) << payloads[k].key;
    }
  }
  static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

  // Sizes straddle the 64-byte alignment and the 2 MB page; the total exceeds one 2 MB page.
  const std::vector<Payload> payloads_ = {{"expert.0", 1 << 20, 1},
                                          {"expert.1", 100, 2},
                                          {"expert.2", 3, 3},
                                          {"expert.3", (1 << 20) + 7, 4},
                                          {"expert.4", 65, 5}};
};

TEST_F(RepackBundleTest, PayloadsLieInOneFileAtAlignedOffsetsFromA2MbBoundary) {
  RepackCache cache(opts());
  int fills = 0;
  const auto at = bind(cache, payloads_, &fills);
  EXPECT_EQ(fills, 5);
  EXPECT_EQ(cache.stats().files_written, 5);
  expect_contents(payloads_, at);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(at[0]) % (2u << 20), 0u);
  for (size_t k = 1; k < at.size(); ++k) {
    EXPECT_EQ(at[k] - at[k - 1], static_cast<ptrdiff_t>(align64(payloads_[k - 1].bytes)));
  }
  EXPECT_EQ(cache_files().size(), 1u);
  EXPECT_EQ(cache_files(".xrb").size(), 1u);
}

TEST_F(RepackBundleTest, ALaterCacheMapsTheBundleWithoutFilling) {
  int fills = 0;
  {
    RepackCache first(opts());
    bind(first, payloads_, &fills);
  }
  fills = 0;
  RepackCache second(opts());
  const auto at = bind(second, payloads_, &fills);
  EXPECT_EQ(fills, 0);
  EXPECT_EQ(second.stats().files_reused, 5);
  EXPECT_EQ(second.stats().files_written, 0);
  expect_contents(payloads_, at);
  EXPECT_EQ(cache_files().size(), 1u);
}

TEST_F(RepackBundleTest, AChangedPayloadRebuildsFromThereKeepingThePrefix) {
  int fills = 0;
  {
    RepackCache first(opts());
    bind(first, payloads_, &fills);
  }
  std::vector<Payload> changed = payloads_;
  changed[2] = {"expert.2.v2", 4000, 9};  // another key and size: everything after it moves
  fills = 0;
  {
    RepackCache second(opts());
    const auto at = bind(second, changed, &fills);
    EXPECT_EQ(fills, 3);  // expert.2.v2, expert.3, expert.4
    EXPECT_EQ(second.stats().files_reused, 2);
    expect_contents(changed, at);
  }
  fills = 0;
  RepackCache third(opts());
  const auto at = bind(third, changed, &fills);
  EXPECT_EQ(fills, 0);
  expect_contents(changed, at);
  EXPECT_EQ(cache_files().size(), 1u);  // rewritten in place under the same name
}

TEST_F(RepackBundleTest, ADamagedFileIsRebuilt) {
  int fills = 0;
  {
    RepackCache first(opts());
    bind(first, payloads_, &fills);
  }
  const std::string file = (dir_ / "cache" / cache_files(".xrb").at(0)).string();
  for (const bool truncate : {true, false}) {
    if (truncate) {
      std::filesystem::resize_file(file, std::filesystem::file_size(file) - 5);
    } else {  // a footer that claims another payload size
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-24, std::ios::end);
      const uint64_t bogus = 64;
      f.write(reinterpret_cast<const char*>(&bogus), 8);
    }
    fills = 0;
    RepackCache again(opts());
    const auto at = bind(again, payloads_, &fills);
    EXPECT_EQ(fills, 5) << (truncate ? "truncated" : "bad footer");
    expect_contents(payloads_, at);
  }
}

TEST_F(RepackBundleTest, AFailedFillLeavesNoFileAndNestingIsRefused) {
  RepackCache cache(opts());
  const Status failed = cache.bind_bundle("layers.0.experts", [&]() -> Status {
    return cache.get_or_create("k", 10, [](std::byte*) -> Status {
      return invalid_argument("tensor 'k' holds a NaN");
    }).status();
  });
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("holds a NaN"), std::string::npos);
  EXPECT_TRUE(cache_files().empty());
  const Status nested = cache.bind_bundle("outer", [&]() -> Status {
    return cache.bind_bundle("inner", [] { return Status{}; });
  });
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.message().find("'inner' opened inside bundle 'outer'"), std::string::npos)
      << nested.message();
}

// Outside a bundle every payload keeps its own file, as before.
TEST_F(RepackBundleTest, PayloadsOutsideABundleKeepTheirOwnFiles) {
  RepackCache cache(opts());
  for (const Payload& p : payloads_) {
    ASSERT_TRUE(cache.get_or_create(p.key, p.bytes, [&](std::byte* d) -> Status {
      for (size_t i = 0; i < p.bytes; ++i) d[i] = p.at(i);
      return {};
    }).ok());
  }
  EXPECT_EQ(cache_files(".xrp").size(), 5u);
  EXPECT_TRUE(cache_files(".xrb").empty());
}

// The range asks for 2 MB pages (smaps lists "hg" for it), in the run that writes the bundle
// and in one that maps it. Skipped where the kernel has no transparent huge pages.
TEST_F(RepackBundleTest, TheRangeAsksForHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage"))
    GTEST_SKIP() << "no transparent huge pages in this kernel";
  auto flags_at = [](const std::byte* p) {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool in = false;
    const auto a = reinterpret_cast<uintptr_t>(p);
    while (std::getline(smaps, line)) {
      uintptr_t lo = 0, hi = 0;
      if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
        in = lo <= a && a < hi;
      } else if (in && line.rfind("VmFlags:", 0) == 0) {
        return line + " ";
      }
    }
    return std::string();
  };
  int fills = 0;
  for (int run = 0; run < 2; ++run) {
    RepackCache cache(opts());
    const auto at = bind(cache, payloads_, &fills);
    EXPECT_NE(flags_at(at[0]).find(" hg "), std::string::npos) << "run " << run;
    EXPECT_NE(flags_at(at[4]).find(" hg "), std::string::npos) << "run " << run;
  }
}

// A bundle writer killed mid-file leaves `<hash>.xrb.tmp.<pid>.*`: removed like a single
// repack file's temporary once that pid is gone.
TEST_F(RepackBundleTest, DeadWritersTemporaryBundleIsRemoved) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  std::filesystem::create_directories(dir_ / "cache");
  const std::string dead = "0123456789abcdef.xrb.tmp." + std::to_string(child) + ".Ab12Cd";
  std::ofstream(dir_ / "cache" / dead) << "partial";
  RepackCache cache(opts());
  int fills = 0;
  bind(cache, payloads_, &fills);
  for (const std::string& f : cache_files()) EXPECT_NE(f, dead);
  EXPECT_EQ(cache_files().size(), 1u);
}

}  // namespace
}  // namespace xds

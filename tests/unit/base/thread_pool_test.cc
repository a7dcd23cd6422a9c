#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace xds {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 1000}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)] += 1;
      });
      for (int h : hits) EXPECT_EQ(h, 1);
    }
  }
}

TEST(ThreadPool, ManyShortJobs) {
  ThreadPool pool(2);
  std::vector<int64_t> sums(2, 0);
  int64_t total = 0;
  for (int rep = 0; rep < 2000; ++rep) {
    std::vector<int64_t> part(2, 0);
    pool.parallel_for(100, [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i) part[static_cast<size_t>(t)] += i;
    });
    total += part[0] + part[1];
  }
  EXPECT_EQ(total, 2000 * 4950);
}

}  // namespace
}  // namespace xds

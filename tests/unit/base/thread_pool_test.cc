#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
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

// Units claimed from a counter: every unit exactly once whichever workers joined, and a
// worker never touches a job after run_on_available has returned: each job's state lives on
// the heap and is freed at once, so a late worker would be a use after free under ASan (and
// a race under TSan). Interleaved with run_on_all and parallel_for, whose generations the
// late workers must not confuse with the closed one.
TEST(ThreadPool, RunOnAvailableCoversEveryUnitAndNoLateWorkerTouchesAClosedJob) {
  for (int spin : {ThreadPool::kDefaultSpin, ThreadPool::kNoSpin}) {
    for (int threads : {2, 3}) {
      ThreadPool pool(threads, spin);
      for (int rep = 0; rep < 2000; ++rep) {
        const int64_t units = 1 + rep % 7;
        auto hits = std::make_unique<std::vector<std::atomic<int>>>(static_cast<size_t>(units));
        std::atomic<int64_t> next{0};
        pool.run_on_available([&](int t) {
          ASSERT_GE(t, 0);
          ASSERT_LT(t, threads);
          for (int64_t u = next.fetch_add(1); u < units; u = next.fetch_add(1))
            (*hits)[static_cast<size_t>(u)].fetch_add(1);
        });
        for (const std::atomic<int>& h : *hits) ASSERT_EQ(h.load(), 1) << "rep " << rep;
        hits.reset();
        if (rep % 3 == 1) {
          std::atomic<int> ran{0};
          pool.run_on_all([&](int) { ran.fetch_add(1); });
          ASSERT_EQ(ran.load(), threads);
        }
        if (rep % 5 == 2) {
          std::atomic<int64_t> sum{0};
          pool.parallel_for(10, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
          });
          ASSERT_EQ(sum.load(), 45);
        }
      }
    }
  }
}

// parallel_for's ranges are ascending, disjoint and cover [0, n) for every n and pool size,
// and a thread's calls never overlap (per-thread scratch indexed by the thread stays private).
TEST(ThreadPool, ParallelForRangesPartitionAndAThreadRunsOneRangeAtATime) {
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {2, 3, 7, 8, 9, 64, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::vector<std::atomic<int>> inside(static_cast<size_t>(threads));
      pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
        EXPECT_LT(b, e);
        EXPECT_EQ(inside[static_cast<size_t>(t)].fetch_add(1), 0) << "thread " << t;
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        inside[static_cast<size_t>(t)].fetch_sub(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
    }
  }
}

}  // namespace
}  // namespace xds

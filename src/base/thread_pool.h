// ThreadPool: a fixed set of worker threads for data-parallel loops.
//
// parallel_for(n, fn) splits [0, n) into contiguous ranges (about four per thread) that the
// threads claim in turn (the caller's thread takes part) and returns when all are done. Workers spin briefly, then
// sleep on a condition variable, so an idle pool costs nothing on an oversubscribed box.
//
// run_on_available(fn) is for work the threads claim from shared counters: it runs fn on the
// caller and on the workers that start before the caller's fn returns, and waits only for
// those. Where another process holds a core, a worker the OS has descheduled does not hold up
// the step: the caller takes its share, and the worker skips the job when it wakes.
//
// Thread-safety: one parallel_for at a time per pool (callers serialize); not reentrant.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace xds {

class ThreadPool {
 public:
  // How long threads poll before sleeping: workers after a job (pause instructions), and the
  // caller of run_on_all waiting for the workers (10x as many). kNoSpin: sleep at once, for
  // pools that share cores with other busy processes (a spinning worker steals their cycles).
  static constexpr int kDefaultSpin = 2000;
  static constexpr int kNoSpin = 0;

  // num_threads counts the caller: 1 means "run everything on the calling thread". Throws
  // std::system_error when the OS refuses a thread (those already started are stopped first).
  explicit ThreadPool(int num_threads, int spin_pauses = kDefaultSpin);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end, thread_index) over a partition of [0, n) into ascending ranges; a
  // thread may get several ranges, one at a time, or none (run_on_available).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  // Calls fn(thread_index) once on every thread.
  void run_on_all(const std::function<void(int)>& fn);

  // Calls fn(0) on the calling thread and fn(thread_index) on every worker that starts
  // before fn(0) has returned (none, some or all); returns when those calls have returned.
  // fn must finish the whole job whichever threads run it: threads claim work from a shared
  // counter and never wait for a given other thread (a thread may wait for work another
  // has claimed and is doing).
  void run_on_available(const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);
  void run_if_open(const std::function<void(int)>& job, int index, uint64_t generation);
  void stop_and_join();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;  // guarded by mu_ / generation_
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  // run_on_available: whether the published job is one (guarded like job_), the generation
  // still open to late workers (0: none), and the workers inside it.
  bool job_optional_ = false;
  std::atomic<uint64_t> open_generation_{0};
  std::atomic<int> joined_{0};
  bool stop_ = false;
  int spin_pauses_ = kDefaultSpin;
};

}  // namespace xds

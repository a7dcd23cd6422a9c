#include "base/thread_pool.h"

#include <algorithm>

namespace xds {

ThreadPool::ThreadPool(int num_threads, int spin_pauses) : spin_pauses_(std::max(0, spin_pauses)) {
  try {
    for (int i = 1; i < std::max(1, num_threads); ++i) {
      workers_.emplace_back([this, i] { worker_loop(i); });
    }
  } catch (...) {  // the OS refused a thread: stop the ones started, then report
    stop_and_join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  stop_and_join();
}

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little before sleeping: kernels issue many short jobs back to back.
    for (int spin = 0; spin < spin_pauses_ && generation_.load(std::memory_order_acquire) == seen;
         ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      job = job_;
    }
    (*job)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  }
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  if (workers_.empty()) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(0);
  for (int spin = 0; spin < 10 * spin_pauses_ && pending_.load(std::memory_order_acquire) != 0;
       ++spin) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n));
  if (threads == 1) {
    fn(0, n, 0);
    return;
  }
  const int total = num_threads();
  run_on_all([&](int t) {
    const int64_t begin = n * t / total;
    const int64_t end = n * (t + 1) / total;
    if (begin < end) fn(begin, end, t);
  });
}

}  // namespace xds

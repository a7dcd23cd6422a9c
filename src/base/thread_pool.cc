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
    bool optional = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      job = job_;
      optional = job_optional_;
    }
    if (optional) {
      run_if_open(*job, index, seen);
      continue;
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
    job_optional_ = false;
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

// Joins the optional job of generation `generation` unless its caller has closed it. The
// increment of joined_ and the caller's close are both sequentially consistent, so either
// this thread sees the job closed (and never touches it), or the caller sees this thread
// joined and waits for it.
void ThreadPool::run_if_open(const std::function<void(int)>& job, int index, uint64_t generation) {
  joined_.fetch_add(1, std::memory_order_seq_cst);
  if (open_generation_.load(std::memory_order_seq_cst) == generation) job(index);
  if (joined_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

void ThreadPool::run_on_available(const std::function<void(int)>& fn) {
  if (workers_.empty()) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_optional_ = true;
    const uint64_t generation = generation_.fetch_add(1, std::memory_order_release) + 1;
    open_generation_.store(generation, std::memory_order_seq_cst);
  }
  cv_.notify_all();
  fn(0);
  open_generation_.store(0, std::memory_order_seq_cst);
  // Only workers already inside fn remain; they are running, so a short spin usually ends it.
  for (int spin = 0; spin < 10 * spin_pauses_ && joined_.load(std::memory_order_seq_cst) != 0;
       ++spin) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return joined_.load(std::memory_order_seq_cst) == 0; });
  // job_ and job_optional_ stay as they are: a worker that wakes for this generation only
  // now still finds it optional, and closed, and never calls the dangling job_.
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (num_threads() == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  // About four ranges per thread, claimed in order from a counter, so that a thread the OS
  // has descheduled leaves its share to the others instead of holding up the loop.
  const int64_t ranges = std::min<int64_t>(n, int64_t{4} * num_threads());
  std::atomic<int64_t> next{0};
  run_on_available([&](int t) {
    for (int64_t r = next.fetch_add(1, std::memory_order_relaxed); r < ranges;
         r = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(n * r / ranges, n * (r + 1) / ranges, t);
    }
  });
}

}  // namespace xds

#include "xccl/thread_fabric.h"

#include <cstdlib>
#include <thread>

namespace xds::xccl {
namespace {

class ThreadDevice final : public Fabric {
 public:
  ThreadDevice(int rank, uint32_t epoch, const ArenaLayout& lay, std::vector<std::byte*> arenas,
               const std::atomic<bool>* dead)
      : Fabric(rank, epoch, lay, std::move(arenas)), dead_(dead) {}
  bool peer_alive(int r) override { return !dead_[r].load(std::memory_order_acquire); }

 private:
  const std::atomic<bool>* dead_;
};

}  // namespace

Result<std::unique_ptr<ThreadFabric>> ThreadFabric::create(const ArenaConfig& cfg, uint32_t epoch) {
  XDS_RETURN_IF_ERROR(validate(cfg));
  const ArenaLayout lay = arena_layout(cfg);
  std::unique_ptr<ThreadFabric> tf(new ThreadFabric());
  const int W = cfg.world_size;
  tf->dead_ = std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(W));
  std::vector<std::byte*> arenas;
  for (int r = 0; r < W; ++r) {
    void* p = std::aligned_alloc(kPage, lay.total);
    if (p == nullptr)
      return resource_exhausted("thread fabric: cannot allocate a {}-byte arena for rank {}",
                                lay.total, r);
    tf->blocks_.push_back(p);
    init_arena(p, lay, r, epoch);
    arenas.push_back(static_cast<std::byte*>(p));
  }
  for (int r = 0; r < W; ++r)
    tf->devices_.push_back(std::make_unique<ThreadDevice>(r, epoch, lay, arenas, tf->dead_.get()));
  return tf;
}

ThreadFabric::~ThreadFabric() {
  devices_.clear();
  for (void* p : blocks_) std::free(p);
}

std::vector<Status> ThreadFabric::run(const std::function<Status(Fabric&)>& fn) {
  std::vector<Status> out(devices_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < devices_.size(); ++r)
    threads.emplace_back([&, r] { out[r] = fn(*devices_[r]); });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace xds::xccl

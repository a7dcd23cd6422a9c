// ThreadFabric: devices as threads of one process, arenas as heap blocks.
//
// Same Fabric interface and the same arena layout as the process fabric, so the protocol code
// runs unchanged under ThreadSanitizer (which cannot see races between processes). A device can
// be marked dead (mark_dead) to test failure handling: peers then see peer_alive() == false.
//
// Thread-safety: create() and the destructor from one thread; device(r) and mark_dead() from
// any thread; device r's Fabric is used by device r's thread(s).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "xccl/fabric.h"

namespace xds::xccl {

class ThreadFabric {
 public:
  static Result<std::unique_ptr<ThreadFabric>> create(const ArenaConfig& cfg, uint32_t epoch);
  ~ThreadFabric();

  int world_size() const { return static_cast<int>(devices_.size()); }
  Fabric& device(int r) { return *devices_[static_cast<size_t>(r)]; }
  void mark_dead(int r) { dead_[static_cast<size_t>(r)].store(true, std::memory_order_release); }

  // Runs fn(device r) on one thread per device; returns every device's status.
  std::vector<Status> run(const std::function<Status(Fabric&)>& fn);

 private:
  ThreadFabric() = default;
  std::vector<void*> blocks_;
  std::unique_ptr<std::atomic<bool>[]> dead_;
  std::vector<std::unique_ptr<Fabric>> devices_;
};

}  // namespace xds::xccl

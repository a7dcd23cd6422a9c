// Launcher: forks N device processes and gives each a ProcessFabric.
//
// Sequence: fork the children first (each blocks on its end of a Unix socketpair, dies with
// the launcher through PR_SET_PDEATHSIG), then create one memfd per device, size it with
// fallocate (out of memory fails here, not as a SIGBUS later), write its identity line, and
// send all fds plus the children's pids to every child with SCM_RIGHTS. The launcher closes
// its fds at once; each child maps every arena, closes the fds and opens a pidfd per peer for
// liveness. Memory lives exactly as long as some device maps it: a SIGKILLed device group
// leaves nothing behind, and nothing is ever created in /dev/shm.
//
// Thread-safety: DeviceGroup is used by the thread that spawned it (the death signal follows
// that thread).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "xccl/fabric.h"

namespace xds::xccl {

struct LaunchOptions {
  int devices = 2;
  ArenaConfig arena{};  // arena.world_size is set to `devices`
  uint32_t epoch = 1;
  // Device i is pinned to the cores [cpus[i % size], + cpus_per_device) (its threads, made
  // later, inherit the set); empty: no pinning.
  std::vector<int> cpus;
  int cpus_per_device = 1;
  // Keep the arenas' memfds in the DeviceGroup so that a dead device can be started again on
  // them (DeviceGroup::respawn); otherwise they are closed once handed over.
  bool keep_arenas = false;
};

// How each device ended: exit code, or the signal that killed it.
struct DeviceExit {
  int exit_code = -1;
  int signal = 0;
  bool ok() const { return signal == 0 && exit_code == 0; }
};

class DeviceGroup {
 public:
  // fn runs in each child with its fabric; its return value is the child's exit code.
  static Result<DeviceGroup> spawn(const LaunchOptions& opts,
                                   const std::function<int(Fabric&)>& fn);
  DeviceGroup(DeviceGroup&&) noexcept;
  DeviceGroup& operator=(DeviceGroup&&) noexcept;
  ~DeviceGroup();  // SIGKILLs and reaps children still running

  const std::vector<pid_t>& pids() const { return pids_; }
  // Starts device `rank` again (its process died: it is reaped first) on the same arenas,
  // running the same function with a fabric of the current pids; its arena is as the dead
  // device left it (the rejoin protocol clears it, xccl/member_fabric.h). Needs
  // LaunchOptions::keep_arenas. Returns the new pid (also in pids()).
  Result<pid_t> respawn(int rank);
  // Waits for every child; returns their exits in rank order.
  Result<std::vector<DeviceExit>> wait();

 private:
  DeviceGroup() = default;
  std::vector<pid_t> pids_;
  bool reaped_ = false;
  // keep_arenas: what respawn() needs (the arenas' memfds stay open).
  std::vector<int> arena_fds_;
  LaunchOptions opts_;
  std::function<int(Fabric&)> fn_;
};

// spawn + wait.
Result<std::vector<DeviceExit>> launch_devices(const LaunchOptions& opts,
                                               const std::function<int(Fabric&)>& fn);

}  // namespace xds::xccl

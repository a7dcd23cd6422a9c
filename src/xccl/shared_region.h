// SharedRegion: memory a process owns and lets its link peers read and write one-sidedly --
// DistFlow's use is a prefill DP group's KV cache, which every decode DP group linked to it
// pulls blocks from (P102). A memfd segment, sized with fallocate up front (too little memory
// is an error here, not a SIGBUS later), mapped shared; links send its fd to each peer
// (link.h), which maps it as the owner's exported region (MemDesc::region = kExportRegion).
//
// Thread-safety: immutable after create(); the bytes are the users' business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace xds::xccl {

// memfd_create(name, MFD_CLOEXEC), then mode 0600 (a memfd starts at 0777; only its owner
// should ever open it, e.g. through /proc/PID/fd). -1 with errno set on failure. Every memfd
// of XCCL (arenas, exported regions) is made here.
int create_owner_only_memfd(const char* name);

class SharedRegion {
 public:
  // ResourceExhausted naming the bytes when the memory cannot be reserved. `name` shows in
  // /proc/PID/maps only.
  static Result<SharedRegion> create(const std::string& name, uint64_t bytes);
  SharedRegion() = default;
  SharedRegion(SharedRegion&& o) noexcept;
  SharedRegion& operator=(SharedRegion&& o) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  int fd() const { return fd_; }
  std::byte* data() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  std::span<std::byte> span() const { return {base_, bytes_}; }

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace xds::xccl

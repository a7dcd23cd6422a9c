#include "xccl/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace xds::xccl {

int create_owner_only_memfd(const char* name) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (fchmod(fd, 0600) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

Result<SharedRegion> SharedRegion::create(const std::string& name, uint64_t bytes) {
  if (bytes == 0) return invalid_argument("shared region '{}': size 0", name);
  const int fd = create_owner_only_memfd(name.c_str());
  if (fd < 0) return internal_error("memfd_create({}): {}", name, std::strerror(errno));
  if (fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    const Status st = resource_exhausted("shared region '{}': cannot reserve {} bytes: {}", name,
                                         bytes, std::strerror(errno));
    close(fd);
    return st;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const Status st = internal_error("mmap({}, {} bytes): {}", name, bytes, std::strerror(errno));
    close(fd);
    return st;
  }
  SharedRegion r;
  r.fd_ = fd;
  r.base_ = static_cast<std::byte*>(p);
  r.bytes_ = bytes;
  return r;
}

SharedRegion::SharedRegion(SharedRegion&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      base_(std::exchange(o.base_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(base_, o.base_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

SharedRegion::~SharedRegion() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace xds::xccl

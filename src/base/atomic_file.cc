#include "base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

namespace xds {

Result<AtomicFile> AtomicFile::create(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // the rename at commit would fail
    return invalid_argument("{}: is a directory, not a file", path);
  }
  AtomicFile f;
  f.path_ = path;
  f.tmp_ = fmt::format("{}.tmp.{}.XXXXXX", path, ::getpid());
  f.fd_ = ::mkstemp(f.tmp_.data());
  if (f.fd_ < 0) {
    return invalid_argument("{}: cannot create the file (a temporary beside it failed: {})", path,
                            std::strerror(errno));
  }
  ::fchmod(f.fd_, 0644);  // mkstemp's 0600 would make the output private
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_(std::move(o.tmp_)),
      fd_(std::exchange(o.fd_, -1)),
      buffer_(std::move(o.buffer_)),
      error_(std::move(o.error_)) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this != &o) {
    discard();
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    fd_ = std::exchange(o.fd_, -1);
    buffer_ = std::move(o.buffer_);
    error_ = std::move(o.error_);
  }
  return *this;
}

AtomicFile::~AtomicFile() {
  discard();
}

void AtomicFile::discard() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
  fd_ = -1;
}

Status AtomicFile::write(const void* data, size_t n) {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return failed_precondition("{}: write after commit", path_);
  buffer_.append(static_cast<const char*>(data), n);
  if (buffer_.size() >= kFlushBytes) return flush();
  return {};
}

Status AtomicFile::flush() {
  const char* p = buffer_.data();
  size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t w = ::write(fd_, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      error_ = resource_exhausted("{}: writing failed: {}", path_,
                                  w < 0 ? std::strerror(errno) : "no progress");
      return error_;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  buffer_.clear();
  return {};
}

Status AtomicFile::commit() {
  if (fd_ < 0) return failed_precondition("{}: commit of a spent file", path_);
  if (error_.ok()) error_ = flush();
  if (error_.ok() && ::close(std::exchange(fd_, -1)) != 0) {
    error_ = resource_exhausted("{}: closing failed: {}", path_, std::strerror(errno));
  }
  if (error_.ok() && ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    error_ = invalid_argument("{}: cannot put the file in place: {}", path_, std::strerror(errno));
  }
  if (!error_.ok()) {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    ::unlink(tmp_.c_str());
  }
  return error_;
}

}  // namespace xds

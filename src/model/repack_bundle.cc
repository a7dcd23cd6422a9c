#include "model/repack_bundle.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/huge_page_buffer.h"

namespace xds {
namespace {

constexpr char kBundleMagic[8] = {'X', 'D', 'S', 'R', 'P', 'B', '0', '1'};
constexpr size_t kFooterBytes = 32;
constexpr size_t kHugePage = size_t{2} << 20;
// Address space reserved per bundle (only what is filled or mapped is ever committed): one
// layer of DeepSeek-V3's 256 experts is 11 GB in int8, 22.5 GB in bf16.
constexpr size_t kReserveBytes = size_t{256} << 30;
constexpr size_t kFallbackReserveBytes = size_t{32} << 30;

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

size_t index_entry_bytes(size_t key_len) {
  return 24 + align_up(key_len, 8);
}

// Reads exactly n bytes at offset, or returns false.
bool read_at(int fd, void* dst, size_t n, off_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, offset);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<RepackBundle>> RepackBundle::open(std::string path) {
  std::unique_ptr<RepackBundle> b(new RepackBundle(std::move(path)));
  for (const size_t want : {kReserveBytes, kFallbackReserveBytes}) {
    void* r = ::mmap(nullptr, want + kHugePage, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) continue;
    b->reservation_ = static_cast<std::byte*>(r);
    b->reservation_bytes_ = want + kHugePage;
    b->reserved_ = want;
    break;
  }
  if (b->reservation_ == nullptr) {
    return resource_exhausted("repack bundle {}: cannot reserve {} GB of address space: {}",
                              b->path_, kFallbackReserveBytes >> 30, std::strerror(errno));
  }
  const auto start = reinterpret_cast<uintptr_t>(b->reservation_);
  b->base_ = b->reservation_ + (align_up(start, kHugePage) - start);
  b->map_existing();
  return b;
}

RepackBundle::~RepackBundle() {
  if (reservation_ != nullptr) ::munmap(reservation_, reservation_bytes_);
}

void RepackBundle::map_existing() {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  uint64_t footer[4] = {};
  std::vector<Entry> entries;
  bool valid = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kFooterBytes &&
               read_at(fd, footer, kFooterBytes, st.st_size - static_cast<off_t>(kFooterBytes)) &&
               std::memcmp(footer, kBundleMagic, 8) == 0;
  const uint64_t payload = footer[1], index = footer[2], count = footer[3];
  valid = valid && payload % 64 == 0 && payload <= reserved_ && index <= (uint64_t{1} << 32) &&
          payload + index + kFooterBytes == static_cast<uint64_t>(st.st_size);
  std::vector<char> idx(valid ? index : 0);
  valid = valid && read_at(fd, idx.data(), idx.size(), static_cast<off_t>(payload));
  // Parse the index: ascending, 64-byte aligned payloads inside [0, payload).
  size_t at = 0, end = 0;
  for (uint64_t i = 0; valid && i < count; ++i) {
    uint64_t h[3];
    if (at + 24 > idx.size()) {
      valid = false;
      break;
    }
    std::memcpy(h, idx.data() + at, 24);
    if (h[0] % 64 != 0 || h[0] < end || h[1] > payload || h[0] > payload - h[1] ||
        h[2] > idx.size() - at - 24) {
      valid = false;
      break;
    }
    entries.push_back({std::string(idx.data() + at + 24, h[2]), h[0], h[1]});
    end = h[0] + h[1];
    at += index_entry_bytes(h[2]);
  }
  valid = valid && at == idx.size();
  if (valid && payload > 0) {
    void* m = ::mmap(base_, payload, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    valid = m != MAP_FAILED;
    // Before the first touch: page-cache misses then read 2 MB folios (huge_page_buffer.h).
    if (valid) advise_huge_pages(base_, payload);
  }
  ::close(fd);
  if (!valid) return;  // absent pieces or a stranger's file: rebuilt under the same name
  existing_ = std::move(entries);
  existing_bytes_ = payload;
}

Status RepackBundle::start_building() {
  // The payloads that matched so far stay at their offsets: keep their bytes across the
  // switch from the file's mapping to anonymous memory.
  std::vector<std::byte> prefix(base_, base_ + used_);
  void* m = ::mmap(base_, reserved_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    return internal_error("repack bundle {}: cannot map anonymous memory: {}", path_,
                          std::strerror(errno));
  }
  advise_huge_pages(base_, reserved_);
  if (used_ > 0) std::memcpy(base_, prefix.data(), used_);
  building_ = true;
  return {};
}

Result<const std::byte*> RepackBundle::get_or_create(const std::string& key, size_t nbytes,
                                                     const Fill& fill, bool* reused) {
  const size_t offset = align_up(used_, 64);
  if (!building_) {
    const size_t i = bound_.size();
    if (i < existing_.size() && existing_[i].key == key && existing_[i].bytes == nbytes &&
        existing_[i].offset == offset) {
      bound_.push_back(existing_[i]);
      used_ = offset + nbytes;
      *reused = true;
      return base_ + offset;
    }
    XDS_RETURN_IF_ERROR(start_building());
  }
  if (nbytes > reserved_ || offset > reserved_ - nbytes) {
    return resource_exhausted("repack bundle {}: {} bytes more do not fit its {} GB of address "
                              "space (at {} bound for {})",
                              path_, nbytes, reserved_ >> 30, bound_.size(), key);
  }
  XDS_RETURN_IF_ERROR(fill(base_ + offset));
  bound_.push_back({key, offset, nbytes});
  used_ = offset + nbytes;
  *reused = false;
  return base_ + offset;
}

size_t RepackBundle::bytes_to_write() const {
  if (!building_ || used_ == 0) return 0;
  size_t index = 0;
  for (const Entry& e : bound_) index += index_entry_bytes(e.key.size());
  return align_up(used_, 64) + index + kFooterBytes;
}

Status RepackBundle::write_file() const {
  std::string tmp = fmt::format("{}.tmp.{}.XXXXXX", path_, ::getpid());
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return internal_error("repack bundle {}: cannot create a temporary file: {}", path_,
                          std::strerror(errno));
  }
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  const size_t payload = align_up(used_, 64);
  size_t index = 0;
  for (const Entry& e : bound_) index += index_entry_bytes(e.key.size());
  const size_t total = payload + index + kFooterBytes;
  // Reserve the blocks now: a full disk is an error here, not a SIGBUS while copying.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
    return fail(resource_exhausted("repack bundle {}: cannot reserve {} bytes: {}", path_, total,
                                   std::strerror(err)));
  }
  void* w = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (w == MAP_FAILED) {
    return fail(internal_error("repack bundle {}: mmap of {} bytes failed: {}", tmp, total,
                               std::strerror(errno)));
  }
  // Written through 2 MB folios, which every later reader then maps as 2 MB pages.
  advise_huge_pages(w, total);
  auto* out = static_cast<std::byte*>(w);
  std::memcpy(out, base_, used_);
  std::memset(out + used_, 0, payload - used_);
  std::byte* at = out + payload;
  for (const Entry& e : bound_) {
    const uint64_t h[3] = {e.offset, e.bytes, e.key.size()};
    std::memcpy(at, h, 24);
    std::memcpy(at + 24, e.key.data(), e.key.size());
    const size_t n = index_entry_bytes(e.key.size());
    std::memset(at + 24 + e.key.size(), 0, n - 24 - e.key.size());
    at += n;
  }
  std::memcpy(at, kBundleMagic, 8);
  const uint64_t footer[3] = {payload, index, bound_.size()};
  std::memcpy(at + 8, footer, 24);
  ::munmap(w, total);
  ::fchmod(fd, 0644);
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return internal_error("repack bundle: rename {} -> {} failed: {}", tmp, path_,
                          std::strerror(err));
  }
  return {};
}

Result<RepackBundle::Range> RepackBundle::finish() {
  size_t payload = building_ ? align_up(used_, 64) : existing_bytes_;
  if (building_ && used_ > 0) {
    XDS_RETURN_IF_ERROR(write_file());
    // The file's pages replace the anonymous copy: one shared copy in the page cache.
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return internal_error("repack bundle {}: cannot open it right after writing it: {}", path_,
                            std::strerror(errno));
    }
    void* m = ::mmap(base_, payload, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (m == MAP_FAILED) {
      return internal_error("repack bundle {}: cannot map it right after writing it: {}", path_,
                            std::strerror(err));
    }
    advise_huge_pages(base_, payload);
  }
  // Keep [base_, base_ + payload rounded up to 2 MB); give the rest of the reservation back.
  const size_t keep = std::min(align_up(payload, kHugePage), reserved_);
  std::byte* const reservation_end = reservation_ + reservation_bytes_;
  if (base_ > reservation_) ::munmap(reservation_, static_cast<size_t>(base_ - reservation_));
  if (base_ + keep < reservation_end) {
    ::munmap(base_ + keep, static_cast<size_t>(reservation_end - (base_ + keep)));
  }
  reservation_ = nullptr;
  reservation_bytes_ = 0;
  return Range{base_, keep};
}

}  // namespace xds

// HugePageBuffer: zero-filled anonymous memory that asks for transparent huge pages
// (madvise MADV_HUGEPAGE: 2 MB pages wherever the kernel's THP mode is "madvise" or
// "always"), for large buffers read in scattered pieces. The KV cache is one: a decode
// step at batch 64 reads ~40 MB of cache blocks per layer in 17 KB pieces, far beyond what
// the TLB covers in 4 KB pages (cold absorbed attention runs faster with 2 MB pages:
// docs/benchmarks.md). Where THP is off the buffer is plain 4 KB pages.
//
// Every page is written at construction, so the memory is committed then, not at first
// use (std::bad_alloc when mmap refuses). Movable, not copyable.
#pragma once

#include <cstddef>

namespace xds {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  size_t size() const { return bytes_; }  // as asked (the mapping is rounded up to 2 MB)
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0, mapped_ = 0;
};

// Asks for 2 MB pages on an existing mapping (madvise MADV_HUGEPAGE), best before it is
// first touched. On a file mapping this is what makes the page-cache misses read in 2 MB
// folios (filesystems with large folios: ext4 on Linux 6.x), which the kernel then maps
// with 2 MB entries in this and every other process that maps the file: the weights stay
// shared, not copied, and a matrix stream crosses no 4 KB page (the routed experts of a
// one-token step gain most: docs/benchmarks.md, "Weights in 2 MB pages").
// A hint: where THP is off, or pages are already cached in smaller folios (read before by
// a process that did not ask), they stay as they are.
void advise_huge_pages(const void* p, size_t bytes);

}  // namespace xds

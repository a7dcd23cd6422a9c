#include "base/huge_page_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>
#include <utility>

namespace xds {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;
}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  if (bytes > SIZE_MAX - kHugePage) throw std::bad_alloc();
  mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    mapped_ = bytes_ = 0;
    throw std::bad_alloc();
  }
  // A hint: where THP is off or no huge page is free, the pages stay 4 KB.
  (void)madvise(p, mapped_, MADV_HUGEPAGE);
  data_ = p;
  // Anonymous pages read as zero; writing one byte per page commits them now.
  auto* bytes_at = static_cast<volatile char*>(p);
  for (size_t at = 0; at < mapped_; at += kPage) bytes_at[at] = 0;
}

HugePageBuffer::~HugePageBuffer() {
  release();
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

void HugePageBuffer::release() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  bytes_ = mapped_ = 0;
}

void advise_huge_pages(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  // madvise wants a page-aligned start; mmap's results are.
  (void)madvise(const_cast<void*>(p), bytes, MADV_HUGEPAGE);
}

}  // namespace xds

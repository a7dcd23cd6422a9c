#include "model/block_allocator.h"

#include <algorithm>
#include <limits>

namespace xds {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  XDS_CHECK(num_blocks >= 0, "BlockAllocator: {} blocks", num_blocks);
  refcount_.assign(static_cast<size_t>(num_blocks), 0);
  retired_.assign(static_cast<size_t>(num_blocks), 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

Result<int32_t> BlockAllocator::allocate() {
  if (free_.empty()) {
    return resource_exhausted("KV blocks: all {} blocks are in use", num_blocks());
  }
  const int32_t b = free_.back();
  free_.pop_back();
  refcount_[static_cast<size_t>(b)] = 1;
  return b;
}

Status BlockAllocator::allocate(int64_t count, std::vector<int32_t>& out) {
  XDS_CHECK(count >= 0, "BlockAllocator::allocate: count {}", count);
  if (count > free_count()) {
    return resource_exhausted("KV blocks: {} needed, {} of {} free", count, free_count(),
                              num_blocks());
  }
  for (int64_t i = 0; i < count; ++i) out.push_back(allocate().value());
  return {};
}

void BlockAllocator::check_held(int32_t b, const char* what) const {
  XDS_CHECK(b >= 0 && b < num_blocks(), "BlockAllocator::{}: block {} out of range [0, {})", what,
            b, num_blocks());
  XDS_CHECK(refcount_[static_cast<size_t>(b)] > 0, "BlockAllocator::{}: block {} is free", what, b);
}

void BlockAllocator::ref(int32_t b) {
  check_held(b, "ref");
  int32_t& count = refcount_[static_cast<size_t>(b)];
  XDS_CHECK(count < std::numeric_limits<int32_t>::max(), "block {}: refcount overflow", b);
  ++count;
}

void BlockAllocator::ref(std::span<const int32_t> blocks) {
  for (const int32_t b : blocks) ref(b);
}

int32_t BlockAllocator::unref(int32_t b) {
  check_held(b, "unref");  // a second unref of a freed block (double free) stops here
  int32_t& count = refcount_[static_cast<size_t>(b)];
  if (--count == 0 && !retired(b)) free_.push_back(b);
  return count;
}

void BlockAllocator::retire(int32_t b) {
  XDS_CHECK(b >= 0 && b < num_blocks(), "BlockAllocator::retire: block {} out of range [0, {})",
            b, num_blocks());
  if (retired(b)) return;
  retired_[static_cast<size_t>(b)] = 1;
  ++retired_count_;
  if (refcount_[static_cast<size_t>(b)] == 0) {
    free_.erase(std::find(free_.begin(), free_.end(), b));
  }
}

void BlockAllocator::unref(std::span<const int32_t> blocks) {
  for (const int32_t b : blocks) unref(b);
}

int32_t BlockAllocator::refcount(int32_t b) const {
  XDS_CHECK(b >= 0 && b < num_blocks(), "BlockAllocator::refcount: block {} out of range [0, {})",
            b, num_blocks());
  return refcount_[static_cast<size_t>(b)];
}

Result<BlockAllocator::Writable> BlockAllocator::ensure_writable(int32_t b) {
  check_held(b, "ensure_writable");
  if (writable(b)) return Writable{b, -1};
  XDS_ASSIGN_OR_RETURN(const int32_t copy, allocate());
  unref(b);  // refcount was > 1: b stays held by the others
  return Writable{copy, b};
}

void BlockAllocator::check_invariants() const {
  std::vector<bool> on_free_list(refcount_.size(), false);
  for (const int32_t b : free_) {
    XDS_CHECK(b >= 0 && b < num_blocks(), "free list holds block {} of {}", b, num_blocks());
    XDS_CHECK(!on_free_list[static_cast<size_t>(b)], "block {} twice on the free list", b);
    on_free_list[static_cast<size_t>(b)] = true;
  }
  int32_t held = 0, idle_retired = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const int32_t count = refcount_[static_cast<size_t>(b)];
    XDS_CHECK(count >= 0, "block {}: refcount {}", b, count);
    XDS_CHECK((count == 0 && !retired(b)) == on_free_list[static_cast<size_t>(b)],
              "block {}: refcount {}{} but {} the free list", b, count,
              retired(b) ? ", retired," : "", on_free_list[static_cast<size_t>(b)] ? "on" : "not on");
    if (count > 0) {
      ++held;
    } else if (retired(b)) {
      ++idle_retired;
    }
  }
  XDS_CHECK(held + free_count() + idle_retired == num_blocks(),
            "{} held + {} free + {} retired != {} blocks", held, free_count(), idle_retired,
            num_blocks());
}

}  // namespace xds

// BlockAllocator: which KV blocks are in use, and by how many holders. A pure policy: block
// ids and reference counts only, no storage and no I/O (the rows live in a KvStorage).
//
// A pool of N blocks, ids [0, N). A block is free (refcount 0, on the free list) or held by
// refcount >= 1 holders. A holder is whatever keeps a block id: a sequence's block table, a
// forked sequence sharing its parent's prefix, or the prefix cache itself.
//
//   allocate()     a free block, refcount 1 (ResourceExhausted when none is free)
//   ref(b)         one more holder of a held block (attach a cached block to a sequence, fork)
//   unref(b)       one holder fewer; at 0 the block returns to the free list
//   writable(b)    refcount == 1: only one holder may write a block. A block with refcount > 1
//                  is never written: its holder takes a private copy (ensure_writable), copies
//                  the rows and writes the copy (copy on write).
//
//   retire(b)      b is bad memory (P120): never handed out again. A free block leaves the free
//                  list at once; a held one stays with its holders and does not return to the
//                  free list when its last holder lets go.
//
// Cached-but-unreferenced blocks: a prefix cache keeps its own reference (the block stays
// at refcount 1, owned by the cache, while no sequence uses it); a sequence that hits the
// cache ref()s it (2); evicting it is the cache's unref() (back to 0, free).
//
// Order: free blocks are handed out last-freed first; a fresh allocator hands out 0, 1, 2...
// Invariants (checked by check_invariants): free_count() + held blocks + retired blocks held
// by nobody == N; a block is on the free list exactly when its refcount is 0 and it is not
// retired. Misuse (unref or ref of a free block, a
// bad id) is a bug in the caller and aborts with XDS_CHECK.
//
// Thread-safety: not thread-safe; one owner (a DP group's scheduler) calls it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace xds {

class BlockAllocator {
 public:
  // A pool of `num_blocks` free blocks (num_blocks >= 0).
  explicit BlockAllocator(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t used_count() const { return num_blocks() - free_count(); }

  // A free block at refcount 1. ResourceExhausted, naming the pool size, when none is free.
  Result<int32_t> allocate();
  // `count` blocks at refcount 1, appended to `out`; all or nothing: ResourceExhausted (and
  // `out` unchanged) when fewer than `count` are free.
  Status allocate(int64_t count, std::vector<int32_t>& out);

  // One more holder of block `b`, which must be held (refcount >= 1).
  void ref(int32_t b);
  // ref() of every block of a table (a fork shares its parent's blocks).
  void ref(std::span<const int32_t> blocks);
  // One holder fewer of block `b`, which must be held; returns the refcount left (0: the
  // block is free again).
  int32_t unref(int32_t b);
  // unref() of every block of a table (a sequence that finishes).
  void unref(std::span<const int32_t> blocks);

  int32_t refcount(int32_t b) const;
  // Takes block `b` out of use for good (see the top of this file); retiring it twice is one.
  void retire(int32_t b);
  bool retired(int32_t b) const { return retired_[static_cast<size_t>(b)] != 0; }
  int32_t retired_count() const { return retired_count_; }
  // Whether block `b` (held) may be written by its holder: refcount == 1.
  bool writable(int32_t b) const { return refcount(b) == 1; }

  // Copy on write for one holder of block `b` (held). If writable(b): {b, -1}. Else a new
  // block replaces this holder's reference: the result is {new block (refcount 1), b}, b
  // loses one reference (it stays held by the others), and the caller copies block b's rows
  // into the new block before writing it (KvStorage::copy_block) and puts the new id in its
  // table. ResourceExhausted (nothing changed) when no block is free.
  struct Writable {
    int32_t block = -1;      // the block to write
    int32_t copy_from = -1;  // the block whose rows must be copied into `block` first; -1: none
  };
  Result<Writable> ensure_writable(int32_t b);

  // Aborts (XDS_CHECK) if the invariants above do not hold: O(N), for tests.
  void check_invariants() const;

 private:
  void check_held(int32_t b, const char* what) const;

  std::vector<int32_t> refcount_;  // [N]
  std::vector<int32_t> free_;      // free block ids; allocate() takes from the back
  std::vector<uint8_t> retired_;   // [N]
  int32_t retired_count_ = 0;
};

}  // namespace xds

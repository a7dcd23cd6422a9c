// The prefix cache (the paper's RTC, P050): full KV blocks found again by their content.
//
// A full block of block_size tokens at block index i of a sequence is named by its chain hash
//   h_i = block_hash(h_{i-1}, tokens[i*bs, (i+1)*bs)),   h_{-1} = kRootHash,
// so equal hashes mean equal prefixes up to and including the block (64 bits; the block's
// tokens and its parent's hash are stored and compared too, so a hash collision needs two
// different prefixes whose parent chains collide).
//
// Reference counts live in the BlockAllocator, which every call takes as an argument (the
// cache stores no pointer to it):
//   insert(b, h)   the cache takes its own reference to full block b (refcount + 1);
//   attach(...)    a sequence that hits refs each block of the chain (refcount + 1);
//   release(b)     a holder lets go (refcount - 1); a cached block left with only the cache's
//                  reference becomes evictable, most recently used first;
//   evict_one()    drops the cache's reference of the least recently used evictable block
//                  (refcount 1 -> 0: back to the allocator's free list).
// Holders of blocks that may be cached (sequences) release through the cache, never by a
// bare BlockAllocator::unref, so that the LRU order is kept.
//
// With MTP layers (mtp_drop_last_hit), a block is a hit only when the block after it is one
// too (a chain of m cached blocks gives m - 1, at most max_blocks): the MTP row at a block's
// last position pairs that position's hidden state with the next token, which only the next
// block's hash covers (and the main model's hidden state there is not cached).
//
// Memory: per block [num_blocks] arrays (hash, parent hash, LRU links, tokens [num_blocks,
// block_size]) and an open-addressing table of 2^k >= 2 * num_blocks slots, all sized at
// construction: no operation allocates.
// Thread-safety: not thread-safe; one owner (the DP group) calls it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/block_allocator.h"

namespace xds::engine {

struct PrefixCacheOptions {
  int32_t num_blocks = 0;  // the allocator's pool size
  int64_t block_size = 16;
  bool mtp_drop_last_hit = false;
};

class PrefixCache {
 public:
  static constexpr uint64_t kRootHash = 0xcbf29ce484222325ull;

  // The chain hash of a block of tokens under `parent` (fnv1a over the ids, then a
  // splitmix64 finaliser).
  static uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens);

  explicit PrefixCache(const PrefixCacheOptions& options);

  struct Match {
    int64_t blocks = 0;              // leading full blocks found (after mtp_drop_last_hit)
    int64_t evictable = 0;           // of those, blocks held only by the cache
    uint64_t last_hash = kRootHash;  // chain hash of the last one (kRootHash: none)
  };
  // The longest cached chain of the leading full blocks of `tokens`, at most max_blocks
  // (< 0: no limit). Read-only: counts nothing, refs nothing.
  Match match(const BlockAllocator& alloc, std::span<const int32_t> tokens,
              int64_t max_blocks) const;
  // match(), then refs each found block and appends it to `table`; counts the query (the
  // full blocks of `tokens` up to max_blocks) and the hits.
  Match attach(BlockAllocator& alloc, std::span<const int32_t> tokens, int64_t max_blocks,
               std::vector<int32_t>& table);

  // Caches full block `b` (held by the caller) under chain hash `hash`, whose block holds
  // `tokens` [block_size] under `parent`. Returns false (and takes no reference) when the
  // hash is cached already (by b or another block with the same content) or b is cached
  // under another hash.
  bool insert(BlockAllocator& alloc, int32_t b, uint64_t parent, uint64_t hash,
              std::span<const int32_t> tokens);
  // One holder of block `b` lets go (BlockAllocator::unref), keeping the LRU order.
  void release(BlockAllocator& alloc, int32_t b);
  // Frees the least recently used evictable block; false when none is evictable.
  bool evict_one(BlockAllocator& alloc);
  // Block `b` leaves the cache (it was retired: never matched again); the cache's reference
  // is dropped. Nothing when b is not cached.
  void forget(BlockAllocator& alloc, int32_t b);

  // Block-hash events (P096: the gateway routes by what each instance has cached): with
  // recording on, every insert appends its chain hash to `added` and every eviction to
  // `removed`, until the owner takes them. Off by default; the vectors are reserved for
  // num_blocks entries each, so a step's events allocate nothing.
  struct Events {
    std::vector<uint64_t> added, removed;
  };
  void record_events(bool on);
  // Moves the events out (the owner sends them), leaving empty reserved vectors.
  void take_events(Events& out);

  bool cached(int32_t b) const { return hash_index_[b] >= 0; }
  int64_t cached_count() const { return cached_; }       // blocks the cache references
  int64_t evictable_count() const { return lru_size_; }  // of those, held by nothing else
  int64_t hits() const { return hits_; }                 // blocks, cumulative
  int64_t queries() const { return queries_; }           // blocks, cumulative
  int64_t block_size() const { return block_size_; }

  // Aborts (XDS_CHECK) if the cache disagrees with `alloc`: every cached block is held,
  // the LRU holds exactly the cached blocks at refcount 1, the table finds every entry.
  // O(num_blocks), for tests.
  void check_invariants(const BlockAllocator& alloc) const;

 private:
  int64_t find(uint64_t hash) const;  // slot index, or -1
  void erase_slot(int64_t slot);
  void lru_push_front(int32_t b);
  void lru_remove(int32_t b);

  int64_t block_size_;
  bool mtp_drop_last_hit_;
  // Open-addressing table (linear probing, backward-shift deletion): slot -> block (-1 empty).
  std::vector<int32_t> slots_;  // [2^k]
  uint64_t slot_mask_ = 0;
  std::vector<uint64_t> hash_;        // [num_blocks] chain hash of a cached block
  std::vector<uint64_t> parent_;      // [num_blocks] its parent's chain hash
  std::vector<int64_t> hash_index_;   // [num_blocks] its slot, -1: not cached
  std::vector<int32_t> tokens_;       // [num_blocks, block_size]
  std::vector<int32_t> prev_, next_;  // [num_blocks] LRU links (-1 ends); head = most recent
  std::vector<uint8_t> in_lru_;       // [num_blocks]
  int32_t head_ = -1, tail_ = -1;
  int64_t lru_size_ = 0;
  int64_t cached_ = 0;
  int64_t hits_ = 0, queries_ = 0;
  bool recording_ = false;
  Events events_;
};

}  // namespace xds::engine

// Per-sequence KV bookkeeping of a DP group: block tables over a BlockAllocator, with the
// prefix cache (docs/design/flowserve.md, "KV blocks"). Block ids only: the rows live in a
// KvStorage, and the copies a fork needs are returned for the caller to perform.
//
// A sequence (slot id from add_sequence) holds a block table: table[i] stores positions
// [i * block_size, (i + 1) * block_size). Its committed length L (commit) is how many
// positions hold final KV; its capacity is table.size() * block_size >= L (reserve may hold
// blocks ahead, e.g. MTP lookahead, which truncate gives back).
//
// Who holds what: each table entry is one reference (BlockAllocator refcount); the prefix
// cache holds one more reference per cached block. Full blocks below L may be shared (prefix
// hits, forks) and are never written again; blocks at or past L / block_size are private
// to the sequence (a fork copies the partial last block), so writing positions >= L never
// touches a shared block.
//
// Accounting: total == free + used + cached, where cached counts the blocks held only by the
// prefix cache (evictable), used every other held block; reserved = sum over sequences of
// max(0, blocks for the expected length (expect) - blocks held).
//
// Thread-safety: not thread-safe; one owner (the DP group's step loop). Sequence ids that are
// not live are caller bugs (XDS_CHECK).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/prefix_cache.h"
#include "model/block_allocator.h"

namespace xds::engine {

struct KvManagerOptions {
  int32_t num_blocks = 0;   // >= 0
  int64_t block_size = 16;  // >= 1
  bool prefix_cache = true;
  bool mtp_drop_last_hit = false;  // with MTP layers: a hit of m blocks attaches m - 1
};

// Copy every layer's rows of block `src` into block `dst` (KvStorage::copy_block).
struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
};

struct KvUsage {
  int64_t total = 0;
  int64_t free = 0;      // on the allocator's free list
  int64_t used = 0;      // held by a sequence
  int64_t cached = 0;    // held only by the prefix cache (evictable)
  int64_t retired = 0;   // taken out of use (bad memory), held or not
  int64_t reserved = 0;  // promised to live sequences' expected lengths, not yet held
};

class KvManager {
 public:
  static Result<KvManager> create(const KvManagerOptions& options);

  // A new, empty sequence; slot ids of freed sequences are reused.
  int64_t add_sequence();
  // Releases every block of `seq` (the last block first, so a prompt's head stays cached
  // longest) and retires the slot.
  void free(int64_t seq);

  // Prefix-cache hits for `tokens` without attaching (the scheduler's hit_blocks and
  // hit_evictable), at most max_blocks (< 0: no limit). Zero without a prefix cache.
  PrefixCache::Match match_prefix(std::span<const int32_t> tokens, int64_t max_blocks) const;
  // Attaches the cached chain of `tokens` (at most max_blocks) to the empty sequence `seq`:
  // its table starts with the hit blocks and its committed length is hits * block_size,
  // which is returned. Counts a prefix-cache query.
  int64_t attach_prefix(int64_t seq, std::span<const int32_t> tokens, int64_t max_blocks);

  // Ensures blocks for positions [0, new_length), evicting cached blocks when the free list
  // is short. ResourceExhausted (nothing changed), naming the sequence and the blocks, when
  // free + evictable blocks are not enough.
  Status reserve(int64_t seq, int64_t new_length);
  // Gives back the blocks past position `length` (MTP rollback, or a reservation not used);
  // InvalidArgument if length < the committed length.
  Status truncate(int64_t seq, int64_t length);
  // Undoes commits back to `tokens` ([0, L), L <= the committed length; a failed step's
  // rollback): the committed length becomes L and the blocks past it go back. Blocks that
  // entered the prefix cache stay there (their rows are valid); a partial last block that is
  // cached is replaced by a copy (appended to `copies` for the caller to perform), so that the
  // sequence never writes a cached block. InvalidArgument if L is above the committed length;
  // ResourceExhausted (nothing changed) when no block can be had for the copy.
  Status rewind(int64_t seq, std::span<const int32_t> tokens, std::vector<BlockCopy>& copies);
  // `tokens` are the sequence's ids at positions [0, L), whose KV is now final: the committed
  // length becomes L and every newly full block enters the prefix cache. InvalidArgument if L
  // is below the committed length or above the capacity.
  Status commit(int64_t seq, std::span<const int32_t> tokens);
  // n > 1: a child sharing `parent`'s full blocks below its committed length; the partial
  // last block is copied into a new block: the copy is appended to `copies` for the caller to
  // perform on the storage before either sequence writes. ResourceExhausted (nothing
  // changed) when no block can be had for the copy.
  Result<int64_t> fork(int64_t parent, std::vector<BlockCopy>& copies);
  // The length `seq` is expected to reach (prompt + max_tokens), for usage().reserved.
  void expect(int64_t seq, int64_t tokens);
  // Bad memory (P120): `blocks` leave the prefix cache and are never handed out again. The
  // sequences holding them must be recomputed (holds_retired); their blocks go back when
  // they are freed, the retired ones excepted.
  void retire(std::span<const int32_t> blocks);
  bool holds_retired(int64_t seq) const;

  std::span<const int32_t> table(int64_t seq) const;
  int64_t length(int64_t seq) const;
  int64_t capacity(int64_t seq) const;
  int64_t block_size() const { return block_size_; }
  // Blocks a reserve can obtain now: free + evictable.
  int64_t available() const { return alloc_.free_count() + cache_.evictable_count(); }
  KvUsage usage() const;
  const PrefixCache& prefix_cache() const { return cache_; }
  // The prefix cache's block-hash events (PrefixCache::record_events).
  void record_cache_events(bool on) { cache_.record_events(on); }
  void take_cache_events(PrefixCache::Events& out) { cache_.take_events(out); }
  const BlockAllocator& allocator() const { return alloc_; }

  // Aborts (XDS_CHECK) unless every block's refcount equals the number of tables holding it
  // plus the cache's reference, and the allocator's and the cache's own invariants hold.
  // O(num_blocks + table entries), for tests.
  void check_invariants() const;

 private:
  struct Seq {
    bool live = false;
    std::vector<int32_t> table;
    int64_t length = 0;                       // committed positions
    int64_t hashed_blocks = 0;                // leading full blocks whose chain hash is known
    uint64_t chain = PrefixCache::kRootHash;  // chain hash of block hashed_blocks - 1
    int64_t expected = 0;                     // expected final length (tokens)
  };
  explicit KvManager(const KvManagerOptions& options);
  Seq& live_seq(int64_t seq);
  const Seq& live_seq(int64_t seq) const;
  Status obtain(int64_t count, int64_t seq, std::vector<int32_t>& out);
  void release_tail(Seq& s, size_t keep);

  int64_t block_size_;
  bool use_cache_;
  BlockAllocator alloc_;
  PrefixCache cache_;
  std::vector<Seq> seqs_;
  std::vector<int64_t> free_slots_;
};

}  // namespace xds::engine

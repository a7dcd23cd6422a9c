#include "engine/prefix_cache.h"

#include <algorithm>
#include <bit>

namespace xds::engine {

uint64_t PrefixCache::block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (const int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;  // the 64-bit FNV prime
  }
  h ^= tokens.size();
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

PrefixCache::PrefixCache(const PrefixCacheOptions& options)
    : block_size_(options.block_size), mtp_drop_last_hit_(options.mtp_drop_last_hit) {
  XDS_CHECK(options.num_blocks >= 0 && options.block_size >= 1,
            "PrefixCache: {} blocks of {} tokens", options.num_blocks, options.block_size);
  const auto n = static_cast<size_t>(options.num_blocks);
  const size_t cap = std::bit_ceil(std::max<size_t>(2 * n, 2));
  slots_.assign(cap, -1);
  slot_mask_ = cap - 1;
  hash_.assign(n, 0);
  parent_.assign(n, 0);
  hash_index_.assign(n, -1);
  tokens_.assign(n * static_cast<size_t>(block_size_), 0);
  prev_.assign(n, -1);
  next_.assign(n, -1);
  in_lru_.assign(n, 0);
}

int64_t PrefixCache::find(uint64_t hash) const {
  for (uint64_t i = hash & slot_mask_;; i = (i + 1) & slot_mask_) {
    const int32_t b = slots_[i];
    if (b < 0) return -1;
    if (hash_[b] == hash) return static_cast<int64_t>(i);
  }
}

void PrefixCache::erase_slot(int64_t slot) {
  auto i = static_cast<uint64_t>(slot);
  slots_[i] = -1;
  for (uint64_t j = (i + 1) & slot_mask_;; j = (j + 1) & slot_mask_) {
    const int32_t b = slots_[j];
    if (b < 0) return;
    // Entry b stays at j if its home slot lies cyclically in (i, j]; else it moves to the hole.
    const uint64_t home = hash_[b] & slot_mask_;
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    slots_[i] = b;
    hash_index_[b] = static_cast<int64_t>(i);
    slots_[j] = -1;
    i = j;
  }
}

void PrefixCache::lru_push_front(int32_t b) {
  XDS_CHECK(!in_lru_[b], "block {} is in the LRU already", b);
  prev_[b] = -1;
  next_[b] = head_;
  if (head_ >= 0) prev_[head_] = b;
  head_ = b;
  if (tail_ < 0) tail_ = b;
  in_lru_[b] = 1;
  ++lru_size_;
}

void PrefixCache::lru_remove(int32_t b) {
  XDS_CHECK(in_lru_[b], "block {} is not in the LRU", b);
  (prev_[b] >= 0 ? next_[prev_[b]] : head_) = next_[b];
  (next_[b] >= 0 ? prev_[next_[b]] : tail_) = prev_[b];
  prev_[b] = next_[b] = -1;
  in_lru_[b] = 0;
  --lru_size_;
}

PrefixCache::Match PrefixCache::match(const BlockAllocator& alloc, std::span<const int32_t> tokens,
                                      int64_t max_blocks) const {
  // With mtp_drop_last_hit the block after the last one returned must match too: look one
  // further, then drop the last found.
  int64_t full = static_cast<int64_t>(tokens.size()) / block_size_;
  if (max_blocks >= 0) full = std::min(full, max_blocks + (mtp_drop_last_hit_ ? 1 : 0));
  Match m;
  uint64_t before_last = kRootHash;
  int64_t last_evictable = 0;
  for (int64_t i = 0; i < full; ++i) {
    const auto blk =
        tokens.subspan(static_cast<size_t>(i * block_size_), static_cast<size_t>(block_size_));
    const uint64_t h = block_hash(m.last_hash, blk);
    const int64_t slot = find(h);
    if (slot < 0) break;
    const int32_t b = slots_[slot];
    const int32_t* stored = tokens_.data() + static_cast<size_t>(b) * block_size_;
    if (parent_[b] != m.last_hash || !std::equal(blk.begin(), blk.end(), stored)) break;
    before_last = m.last_hash;
    m.last_hash = h;
    ++m.blocks;
    last_evictable = alloc.refcount(b) == 1 ? 1 : 0;
    m.evictable += last_evictable;
  }
  if (mtp_drop_last_hit_ && m.blocks > 0) {
    --m.blocks;
    m.evictable -= last_evictable;
    m.last_hash = before_last;
  }
  return m;
}

PrefixCache::Match PrefixCache::attach(BlockAllocator& alloc, std::span<const int32_t> tokens,
                                       int64_t max_blocks, std::vector<int32_t>& table) {
  const Match m = match(alloc, tokens, max_blocks);
  int64_t full = static_cast<int64_t>(tokens.size()) / block_size_;
  if (max_blocks >= 0) full = std::min(full, max_blocks);
  queries_ += full;
  hits_ += m.blocks;
  uint64_t h = kRootHash;
  for (int64_t i = 0; i < m.blocks; ++i) {
    h = block_hash(
        h, tokens.subspan(static_cast<size_t>(i * block_size_), static_cast<size_t>(block_size_)));
    const int32_t b = slots_[find(h)];
    if (in_lru_[b]) lru_remove(b);
    alloc.ref(b);
    table.push_back(b);
  }
  return m;
}

bool PrefixCache::insert(BlockAllocator& alloc, int32_t b, uint64_t parent, uint64_t hash,
                         std::span<const int32_t> tokens) {
  XDS_CHECK(b >= 0 && static_cast<size_t>(b) < hash_.size(), "PrefixCache::insert: block {}", b);
  XDS_CHECK(static_cast<int64_t>(tokens.size()) == block_size_,
            "PrefixCache::insert: {} tokens in a block of {}", tokens.size(), block_size_);
  if (cached(b) || find(hash) >= 0) return false;
  alloc.ref(b);
  uint64_t i = hash & slot_mask_;
  while (slots_[i] >= 0) i = (i + 1) & slot_mask_;
  slots_[i] = b;
  hash_[b] = hash;
  parent_[b] = parent;
  hash_index_[b] = static_cast<int64_t>(i);
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<int64_t>(b) * block_size_);
  ++cached_;
  if (recording_) events_.added.push_back(hash);
  return true;
}

void PrefixCache::release(BlockAllocator& alloc, int32_t b) {
  const int32_t left = alloc.unref(b);
  if (left == 1 && cached(b)) lru_push_front(b);
}

bool PrefixCache::evict_one(BlockAllocator& alloc) {
  const int32_t b = tail_;
  if (b < 0) return false;
  lru_remove(b);
  erase_slot(hash_index_[b]);
  hash_index_[b] = -1;
  --cached_;
  if (recording_) events_.removed.push_back(hash_[b]);
  const int32_t left = alloc.unref(b);
  XDS_CHECK(left == 0, "evicted block {} still has {} holders", b, left);
  return true;
}

void PrefixCache::forget(BlockAllocator& alloc, int32_t b) {
  if (!cached(b)) return;
  if (in_lru_[static_cast<size_t>(b)]) lru_remove(b);
  erase_slot(hash_index_[b]);
  hash_index_[b] = -1;
  --cached_;
  if (recording_) events_.removed.push_back(hash_[b]);
  alloc.unref(b);
}

void PrefixCache::record_events(bool on) {
  recording_ = on;
  events_.added.reserve(hash_.size());
  events_.removed.reserve(hash_.size());
}

void PrefixCache::take_events(Events& out) {
  out.added.clear();
  out.removed.clear();
  std::swap(out, events_);
  events_.added.reserve(hash_.size());
  events_.removed.reserve(hash_.size());
}

void PrefixCache::check_invariants(const BlockAllocator& alloc) const {
  XDS_CHECK(static_cast<size_t>(alloc.num_blocks()) == hash_.size(),
            "cache of {} blocks over a pool of {}", hash_.size(), alloc.num_blocks());
  int64_t cached = 0, at_one = 0;
  for (int32_t b = 0; b < alloc.num_blocks(); ++b) {
    if (hash_index_[b] < 0) {
      XDS_CHECK(!in_lru_[b], "uncached block {} in the LRU", b);
      continue;
    }
    ++cached;
    XDS_CHECK(slots_[hash_index_[b]] == b, "block {}: slot {} holds {}", b, hash_index_[b],
              slots_[hash_index_[b]]);
    XDS_CHECK(find(hash_[b]) == hash_index_[b], "block {}: its hash is not found", b);
    const int32_t rc = alloc.refcount(b);
    XDS_CHECK(rc >= 1, "cached block {} has refcount {}", b, rc);
    XDS_CHECK((rc == 1) == (in_lru_[b] != 0), "block {}: refcount {}, in LRU {}", b, rc,
              in_lru_[b]);
    at_one += rc == 1;
  }
  XDS_CHECK(cached == cached_, "{} cached blocks counted, {} recorded", cached, cached_);
  int64_t walked = 0;
  for (int32_t b = head_; b >= 0; b = next_[b]) {
    XDS_CHECK(in_lru_[b] && walked < lru_size_, "LRU list broken at block {}", b);
    ++walked;
  }
  XDS_CHECK(walked == lru_size_ && walked == at_one,
            "LRU: {} walked, {} recorded, {} at refcount 1", walked, lru_size_, at_one);
  int64_t used_slots = 0;
  for (const int32_t b : slots_) used_slots += b >= 0;
  XDS_CHECK(used_slots == cached_, "{} slots used for {} cached blocks", used_slots, cached_);
}

}  // namespace xds::engine

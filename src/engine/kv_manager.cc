#include "engine/kv_manager.h"

#include <algorithm>

namespace xds::engine {

namespace {
int64_t blocks_covering(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}
}  // namespace

Result<KvManager> KvManager::create(const KvManagerOptions& options) {
  if (options.num_blocks < 0 || options.block_size < 1) {
    return invalid_argument("KV manager: num_blocks {} must be >= 0 and block_size {} >= 1",
                            options.num_blocks, options.block_size);
  }
  return KvManager(options);
}

KvManager::KvManager(const KvManagerOptions& options)
    : block_size_(options.block_size),
      use_cache_(options.prefix_cache),
      alloc_(options.num_blocks),
      cache_({.num_blocks = options.prefix_cache ? options.num_blocks : 0,
              .block_size = options.block_size,
              .mtp_drop_last_hit = options.mtp_drop_last_hit}) {}

KvManager::Seq& KvManager::live_seq(int64_t seq) {
  XDS_CHECK(seq >= 0 && static_cast<size_t>(seq) < seqs_.size() && seqs_[seq].live,
            "KV manager: sequence {} is not live", seq);
  return seqs_[seq];
}

const KvManager::Seq& KvManager::live_seq(int64_t seq) const {
  XDS_CHECK(seq >= 0 && static_cast<size_t>(seq) < seqs_.size() && seqs_[seq].live,
            "KV manager: sequence {} is not live", seq);
  return seqs_[seq];
}

int64_t KvManager::add_sequence() {
  int64_t id;
  if (!free_slots_.empty()) {
    id = free_slots_.back();
    free_slots_.pop_back();
  } else {
    id = static_cast<int64_t>(seqs_.size());
    seqs_.emplace_back();
  }
  Seq& s = seqs_[id];
  s.live = true;
  s.table.clear();
  s.length = s.hashed_blocks = s.expected = 0;
  s.chain = PrefixCache::kRootHash;
  return id;
}

// Releases table entries [keep, size), the last first.
void KvManager::release_tail(Seq& s, size_t keep) {
  while (s.table.size() > keep) {
    const int32_t b = s.table.back();
    s.table.pop_back();
    if (use_cache_) {
      cache_.release(alloc_, b);
    } else {
      alloc_.unref(b);
    }
  }
}

void KvManager::free(int64_t seq) {
  Seq& s = live_seq(seq);
  release_tail(s, 0);
  s.live = false;
  free_slots_.push_back(seq);
}

PrefixCache::Match KvManager::match_prefix(std::span<const int32_t> tokens,
                                           int64_t max_blocks) const {
  if (!use_cache_) return {};
  return cache_.match(alloc_, tokens, max_blocks);
}

int64_t KvManager::attach_prefix(int64_t seq, std::span<const int32_t> tokens, int64_t max_blocks) {
  Seq& s = live_seq(seq);
  XDS_CHECK(s.table.empty() && s.length == 0, "attach_prefix: sequence {} is not empty", seq);
  if (!use_cache_) return 0;
  const PrefixCache::Match m = cache_.attach(alloc_, tokens, max_blocks, s.table);
  s.length = m.blocks * block_size_;
  s.hashed_blocks = m.blocks;
  s.chain = m.last_hash;
  return s.length;
}

// Appends `count` fresh blocks to `out`, evicting cached blocks while the free list is short.
Status KvManager::obtain(int64_t count, int64_t seq, std::vector<int32_t>& out) {
  if (count > available()) {
    return resource_exhausted("KV blocks: sequence {} needs {} more, {} free + {} evictable of {}",
                              seq, count, alloc_.free_count(), cache_.evictable_count(),
                              alloc_.num_blocks());
  }
  while (alloc_.free_count() < count) XDS_CHECK(cache_.evict_one(alloc_), "nothing to evict");
  return alloc_.allocate(count, out);
}

Status KvManager::reserve(int64_t seq, int64_t new_length) {
  Seq& s = live_seq(seq);
  if (new_length < 0) return invalid_argument("reserve: sequence {} length {}", seq, new_length);
  const int64_t need =
      blocks_covering(new_length, block_size_) - static_cast<int64_t>(s.table.size());
  if (need <= 0) return {};
  return obtain(need, seq, s.table);
}

Status KvManager::truncate(int64_t seq, int64_t length) {
  Seq& s = live_seq(seq);
  if (length < s.length) {
    return invalid_argument("truncate: sequence {} to {} positions, below its committed {}", seq,
                            length, s.length);
  }
  release_tail(s, static_cast<size_t>(std::min<int64_t>(blocks_covering(length, block_size_),
                                                        static_cast<int64_t>(s.table.size()))));
  return {};
}

Status KvManager::rewind(int64_t seq, std::span<const int32_t> tokens,
                         std::vector<BlockCopy>& copies) {
  const auto len = static_cast<int64_t>(tokens.size());
  if (len > live_seq(seq).length) {
    return invalid_argument("rewind: sequence {} to {} positions, above its committed {}", seq, len,
                            live_seq(seq).length);
  }
  const int64_t full = len / block_size_;
  const bool partial = len % block_size_ != 0;
  int32_t copy = -1;
  if (partial && live_seq(seq).hashed_blocks > full) {  // the partial block is cached
    std::vector<int32_t> one;
    XDS_RETURN_IF_ERROR(obtain(1, seq, one));
    copy = one[0];
  }
  Seq& s = live_seq(seq);
  release_tail(s, static_cast<size_t>(std::min<int64_t>(blocks_covering(len, block_size_),
                                                        static_cast<int64_t>(s.table.size()))));
  if (copy >= 0) {
    const int32_t old = s.table.back();
    copies.push_back({.src = old, .dst = copy});
    s.table.back() = copy;
    if (use_cache_) {
      cache_.release(alloc_, old);
    } else {
      alloc_.unref(old);
    }
  }
  s.length = len;
  if (s.hashed_blocks > full) {
    s.hashed_blocks = 0;
    s.chain = PrefixCache::kRootHash;
    for (int64_t i = 0; i < full; ++i) {
      s.chain = PrefixCache::block_hash(
          s.chain, tokens.subspan(static_cast<size_t>(i * block_size_),
                                  static_cast<size_t>(block_size_)));
      s.hashed_blocks = i + 1;
    }
  }
  return {};
}

Status KvManager::commit(int64_t seq, std::span<const int32_t> tokens) {
  Seq& s = live_seq(seq);
  const auto len = static_cast<int64_t>(tokens.size());
  if (len < s.length || len > capacity(seq)) {
    return invalid_argument("commit: sequence {} to {} positions, committed {}, capacity {}", seq,
                            len, s.length, capacity(seq));
  }
  s.length = len;
  if (!use_cache_) return {};
  for (int64_t i = s.hashed_blocks; i < len / block_size_; ++i) {
    const auto blk =
        tokens.subspan(static_cast<size_t>(i * block_size_), static_cast<size_t>(block_size_));
    const uint64_t h = PrefixCache::block_hash(s.chain, blk);
    cache_.insert(alloc_, s.table[i], s.chain, h, blk);
    s.chain = h;
    s.hashed_blocks = i + 1;
  }
  return {};
}

Result<int64_t> KvManager::fork(int64_t parent, std::vector<BlockCopy>& copies) {
  const Seq& p = live_seq(parent);
  const int64_t full = p.length / block_size_;
  const bool partial = p.length % block_size_ != 0;
  int32_t copy = -1;
  if (partial) {
    std::vector<int32_t> one;  // fork is once per n > 1 request, not per step
    XDS_RETURN_IF_ERROR(obtain(1, parent, one));
    copy = one[0];
  }
  const int64_t child = add_sequence();  // may move seqs_: no reference to p past here
  Seq& c = seqs_[child];
  const Seq& q = seqs_[parent];
  c.table.assign(q.table.begin(), q.table.begin() + full);
  alloc_.ref(c.table);
  if (partial) {
    copies.push_back({.src = q.table[full], .dst = copy});
    c.table.push_back(copy);
  }
  c.length = q.length;
  c.hashed_blocks = q.hashed_blocks;
  c.chain = q.chain;
  c.expected = q.expected;
  return child;
}

void KvManager::expect(int64_t seq, int64_t tokens) {
  live_seq(seq).expected = tokens;
}

std::span<const int32_t> KvManager::table(int64_t seq) const {
  return live_seq(seq).table;
}
int64_t KvManager::length(int64_t seq) const {
  return live_seq(seq).length;
}
int64_t KvManager::capacity(int64_t seq) const {
  return static_cast<int64_t>(live_seq(seq).table.size()) * block_size_;
}

void KvManager::retire(std::span<const int32_t> blocks) {
  for (const int32_t b : blocks) {
    if (use_cache_) cache_.forget(alloc_, b);
    alloc_.retire(b);
  }
}

bool KvManager::holds_retired(int64_t seq) const {
  for (const int32_t b : live_seq(seq).table) {
    if (alloc_.retired(b)) return true;
  }
  return false;
}

KvUsage KvManager::usage() const {
  KvUsage u;
  u.total = alloc_.num_blocks();
  u.free = alloc_.free_count();
  u.cached = cache_.evictable_count();
  u.retired = alloc_.retired_count();
  u.used = u.total - u.free - u.cached - u.retired;
  for (const Seq& s : seqs_) {
    if (!s.live) continue;
    u.reserved += std::max<int64_t>(
        0, blocks_covering(s.expected, block_size_) - static_cast<int64_t>(s.table.size()));
  }
  return u;
}

void KvManager::check_invariants() const {
  alloc_.check_invariants();
  if (use_cache_) cache_.check_invariants(alloc_);
  std::vector<int32_t> holders(static_cast<size_t>(alloc_.num_blocks()), 0);
  for (const Seq& s : seqs_) {
    if (!s.live) continue;
    XDS_CHECK(s.length <= static_cast<int64_t>(s.table.size()) * block_size_,
              "sequence length {} past its {} blocks", s.length, s.table.size());
    for (const int32_t b : s.table) ++holders[b];
  }
  for (int32_t b = 0; b < alloc_.num_blocks(); ++b) {
    const int32_t want = holders[b] + (use_cache_ && cache_.cached(b) ? 1 : 0);
    XDS_CHECK(alloc_.refcount(b) == want, "block {}: refcount {}, {} holders", b,
              alloc_.refcount(b), want);
  }
  const KvUsage u = usage();
  XDS_CHECK(u.free + u.used + u.cached + u.retired == u.total,
            "free {} + used {} + cached {} + retired {} != {}", u.free, u.used, u.cached, u.retired,
            u.total);
}

}  // namespace xds::engine

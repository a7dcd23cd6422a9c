// Paged latent KV cache for MLA.
//
// One pool of fixed-size blocks shared by all sequences; each sequence owns a block table.
// Per layer (the MTP layers included) two planes, fp32:
//   latent: [num_blocks, block_size, latent_ld]         c = kv_a_layernorm(kv_a[:C]) in the
//           first kv_lora_rank floats of a row; latent_ld = padded_latent_stride(C), an odd
//           number of cache lines (528 at C = 512: +3 % memory, +6-9 % absorbed
//           attention in a cold single-thread microbenchmark)
//   rope:   [num_blocks, block_size, qk_rope_head_dim]  rotated k_pe
// Keeping the planes apart leaves room for an INT8 latent plane later (P090).
//
// Thread-safety: not thread-safe. The forward pass writes slots of distinct positions from
// several threads, which is safe once reserve() has run for every sequence in the step.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/mla_attention.h"

namespace xds {

struct KvCacheShape {
  int64_t layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t latent_dim = 0;
  int64_t rope_dim = 0;
};

class KvCache {
 public:
  // The pool, zero-filled. ResourceExhausted, naming the tokens, the layers and the bytes,
  // when the planes need more than `available_bytes` (default: the machine's MemAvailable,
  // base/memory_info.h; -1: unchecked) or than the allocator gives: the error a user gets
  // for a too-long --max-tokens, instead of std::bad_alloc or the OOM killer. MemAvailable
  // counts the page cache, the mapped weights' pages included: a cache that passes can still
  // push them out; this refuses what cannot fit at all.
  static Result<KvCache> create(const KvCacheShape& shape, int64_t available_bytes);
  static Result<KvCache> create(const KvCacheShape& shape);
  // Bytes of the two planes, or -1 if they overflow int64.
  static int64_t bytes_for(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }

  // Returns a new, empty sequence slot.
  int64_t add_sequence();
  // Frees the blocks of `seq`; the slot id may be reused.
  void free_sequence(int64_t seq);
  // Ensures blocks for positions [0, length). ResourceExhausted if the pool is full.
  Status reserve(int64_t seq, int64_t length);
  int64_t capacity(int64_t seq) const;
  int64_t free_blocks() const { return static_cast<int64_t>(free_list_.size()); }

  float* latent_slot(int64_t layer, int64_t seq, int64_t pos);
  float* rope_slot(int64_t layer, int64_t seq, int64_t pos);
  kernels::LatentKvView view(int64_t layer, int64_t seq) const;

 private:
  explicit KvCache(const KvCacheShape& shape);
  int64_t slot_index(int64_t seq, int64_t pos) const;

  KvCacheShape shape_;
  int64_t latent_ld_ = 0;      // row stride of the latent plane, floats
  std::vector<float> latent_;  // [layers, num_blocks, block_size, latent_ld_]
  std::vector<float> rope_;    // [layers, num_blocks, block_size, rope_dim]
  std::vector<int32_t> free_list_;
  std::vector<std::vector<int32_t>> tables_;  // per sequence slot
  std::vector<bool> live_;
};

}  // namespace xds

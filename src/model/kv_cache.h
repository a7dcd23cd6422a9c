// Paged latent KV cache for MLA.
//
// One pool of fixed-size blocks shared by all sequences; each sequence owns a block table.
// Per layer (the MTP layers included) two planes of KvCacheShape::dtype elements (fp32, or
// bf16 for the fast mode's absorbed attention, which rounds every cached row to bf16
// anyway: half the bytes for the same products):
//   latent: [num_blocks, block_size, latent_ld]         c = kv_a_layernorm(kv_a[:C]) in the
//           first kv_lora_rank elements of a row; latent_ld = padded_latent_stride(C), an
//           odd number of cache lines (528 floats or 544 bf16 at C = 512: +3 / +6 %
//           memory, +6-9 % absorbed attention in a cold single-thread microbenchmark)
//   rope:   [num_blocks, block_size, qk_rope_head_dim]  rotated k_pe
// Keeping the planes apart leaves room for an INT8 latent plane later (P090).
//
// Thread-safety: not thread-safe. The forward pass writes slots of distinct positions from
// several threads, which is safe once reserve() has run for every sequence in the step.
#pragma once

#include <cstdint>
#include <vector>

#include "base/huge_page_buffer.h"
#include "base/status.h"
#include "kernels/cpu/mla_attention.h"
#include "tensor/dtype.h"

namespace xds {

struct KvCacheShape {
  int64_t layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t latent_dim = 0;
  int64_t rope_dim = 0;
  DType dtype = DType::kF32;  // kF32 or kBF16 (which needs kernels::absorbed_bf16_available())
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

  // Stores position `pos` of `seq` in `layer`: latent [latent_dim] and rope [rope_dim],
  // rounded to bf16 (kernels::kv_row_to_bf16) in a bf16 cache. The block must be reserved.
  void write(int64_t layer, int64_t seq, int64_t pos, const float* latent, const float* rope);
  kernels::LatentKvView view(int64_t layer, int64_t seq) const;

 private:
  explicit KvCache(const KvCacheShape& shape);
  int64_t slot_index(int64_t seq, int64_t pos) const;

  KvCacheShape shape_;
  int64_t latent_ld_ = 0;  // row stride of the latent plane, elements
  // The planes, of shape_.dtype elements, in huge pages where the kernel gives them (the
  // blocks of a step are read scattered): latent [layers, num_blocks, block_size,
  // latent_ld_], rope [..., rope_dim].
  HugePageBuffer latent_, rope_;
  std::vector<int32_t> free_list_;
  std::vector<std::vector<int32_t>> tables_;  // per sequence slot
  std::vector<bool> live_;
};

}  // namespace xds

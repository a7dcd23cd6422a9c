// KvCache: a convenience for one process that runs sequences itself (generate, perplexity,
// tests, benchmarks): a BlockAllocator, a KvStorage and a block table per sequence slot.
// The serving engine keeps its own tables (and a prefix cache) over the same two parts.
//
// The MLA planes per layer (the MTP layers included), of KvCacheShape::dtype elements (fp32,
// or bf16 for the fast mode's absorbed attention, which rounds every cached row to bf16
// anyway: half the bytes for the same products):
//   latent: C = latent_dim elements, c = kv_a_layernorm(kv_a[:C]); row stride
//           padded_latent_stride(C), an odd number of cache lines (528 floats or 544 bf16 at
//           C = 512; what the padding costs and buys: docs/benchmarks.md, "Measurements behind
//           choices in the code")
//   rope:   rope_dim elements, rotated k_pe
// or, for an INT8 cache (dtype kI8), the INT8 latent's three planes (kv_storage.h).
// laid out block-major as KvStorage describes.
//
// Thread-safety: not thread-safe. The forward pass writes rows of distinct positions from
// several threads, which is safe once the step's chunks have their blocks (chunk()).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/mla_attention.h"
#include "model/block_allocator.h"
#include "model/kv_storage.h"
#include "model/step_io.h"
#include "tensor/dtype.h"

namespace xds {

struct KvCacheShape {
  int64_t layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t latent_dim = 0;
  int64_t rope_dim = 0;
  // kF32, kBF16 (which needs kernels::absorbed_bf16_available()) or kI8 (the INT8 latent,
  // mla_int8_kv_layout, with a rope plane of rope_dtype: kF32, or kBF16 as above)
  DType dtype = DType::kF32;
  DType rope_dtype = DType::kF32;

  KvStorageShape storage_shape() const;
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
  // Any layout (CausalLm::kv_layout()); available_bytes as above.
  static Result<KvCache> create(const KvStorageShape& shape, int64_t available_bytes);
  // Bytes of the planes, or -1 if they overflow int64.
  static int64_t bytes_for(const KvCacheShape& shape);

  const KvStorageShape& shape() const { return storage_.shape(); }
  int64_t block_size() const { return storage_.block_size(); }
  KvStorage& storage() { return storage_; }
  const KvStorage& storage() const { return storage_; }
  const BlockAllocator& allocator() const { return allocator_; }

  // Returns a new, empty sequence slot.
  int64_t add_sequence();
  // Frees the blocks of `seq`; the slot id may be reused.
  void free_sequence(int64_t seq);
  // Ensures blocks for positions [0, length). ResourceExhausted if the pool is full (nothing
  // allocated then).
  Status reserve(int64_t seq, int64_t length);
  // Gives back the blocks of `seq` past position `length` (0 <= length): its capacity becomes
  // the fewest blocks covering [0, length). MTP rollback: the rows of rejected positions in a
  // kept block stay as they are, and the next step writes them again before any attention
  // reads them (a chunk's token at position t reads rows [0, t], and the rows from the
  // chunk's start_pos to t it has written itself).
  void truncate(int64_t seq, int64_t length);
  int64_t capacity(int64_t seq) const;
  int64_t free_blocks() const { return allocator_.free_count(); }
  // The block table of `seq`; valid until its next reserve() or free_sequence().
  std::span<const int32_t> blocks(int64_t seq) const;

  // reserve(seq, start_pos + tokens.size()), then the chunk carrying seq's block table
  // (valid until seq's next reserve or free).
  Result<TokenChunk> chunk(int64_t seq, int64_t start_pos, std::span<const int32_t> tokens,
                           bool all_logits = false);
  Result<MtpChunk> mtp_chunk(int64_t seq, int64_t start_pos, std::span<const int32_t> next_tokens,
                             const float* hidden);

  // Stores position `pos` of `seq` in `layer` (KvStorage::write); the block must be reserved.
  void write(int64_t layer, int64_t seq, int64_t pos, const float* latent, const float* rope);
  kernels::LatentKvView view(int64_t layer, int64_t seq) const;

 private:
  KvCache(KvStorage storage);
  void check_seq(int64_t seq) const;

  KvStorage storage_;
  BlockAllocator allocator_;
  std::vector<std::vector<int32_t>> tables_;  // per sequence slot
  std::vector<bool> live_;
};

}  // namespace xds

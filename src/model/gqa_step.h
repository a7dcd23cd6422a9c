// The pieces of a forward step that every grouped-query-attention family shares (Qwen3-MoE,
// GLM-4.5): the step's chunks in batch order with their checks, the KV storage's check, and
// the attention of one layer over the paged GQA cache (gqa_kv.h) once q, k and v are final
// (normed and rotated as the family does).
//
// Thread-safety: a GqaStep and a GqaAttention belong to one model and run one step at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/kv_storage.h"

namespace xds {

// A run of consecutive tokens of one sequence in the step.
struct GqaChunk {
  std::span<const int32_t> blocks;  // the sequence's block table
  int64_t start_pos = 0;            // position of the chunk's first token
  int64_t begin = 0;                // index of its first token in batch order
  int64_t count = 0;
};

class GqaStep {
 public:
  void clear();
  // Adds chunk `index` (tokens at start_pos.., over `blocks`). InvalidArgument naming the chunk
  // when a token is outside [0, vocab_size), start_pos < 0, or the block table does not cover
  // the positions with blocks of `kv`; nothing is added then.
  Status append(size_t index, int64_t start_pos, std::span<const int32_t> tokens,
                std::span<const int32_t> blocks, const KvStorage& kv, int64_t vocab_size);

  const std::vector<GqaChunk>& chunks() const { return chunks_; }
  int64_t n() const { return n_; }                  // tokens in the step
  int64_t pos(int64_t t) const { return pos_[t]; }  // absolute position of token t
  int64_t max_end() const;                          // max over chunks of start_pos + count

 private:
  std::vector<GqaChunk> chunks_;
  std::vector<int64_t> pos_;  // [n]
  int64_t n_ = 0;
};

// InvalidArgument unless `kv` holds at least want.layers layers of want's GQA planes (K and V
// of kv_heads heads of head_dim).
Status check_gqa_storage(const KvLayout& want, const KvStorage& kv, int64_t kv_heads,
                         int64_t head_dim);

// The inputs and output of one layer's attention. H query heads, KV heads, Dh = head_dim.
struct GqaLayerIo {
  int64_t layer = 0;         // cache layer
  int64_t heads = 0;         // H
  int64_t kv_heads = 0;      // KV (H a multiple of it; query head h reads KV head h / (H / KV))
  int64_t head_dim = 0;      // Dh
  float scale = 1.0f;        // softmax scale
  const float* q = nullptr;  // [n, H·Dh] after the family's norms and RoPE
  const float* k = nullptr;  // [n, KV·Dh] likewise
  const float* v = nullptr;  // [n, KV·Dh]
  float* out = nullptr;      // [n, H·Dh] attention outputs (before o_proj)
};

class GqaAttention {
 public:
  // Stores every token's K and V at its position (all rows of the step before any attention
  // reads them), then runs causal GQA attention of each chunk over its sequence's cache.
  void run(const GqaStep& step, KvStorage& kv, const GqaLayerIo& io, ThreadPool& pool);

 private:
  struct Item {  // one thread's unit: a KV head over a tile of a chunk
    int64_t chunk, head, first, count;
  };
  std::vector<Item> items_;
  std::vector<float> scratch_;  // [threads, gqa_scratch_floats(tile)]
};

}  // namespace xds

// Grouped-query attention over a paged KV cache (Qwen3-MoE, GLM-4.5; design:
// docs/design/qwen3_moe.md), and the rotate-half rotary embedding its q and k take.
//
// The cache keeps, per layer and per KV head, a K plane and a V plane: in block b the rows
// of positions [b·block_size, (b+1)·block_size) of one head lie next to each other,
// [block_size, head_dim] f32, bf16, or int8 with an f32 scale per row in a plane of its own
// (model/gqa_kv.h draws the block). One call computes the
// attention of the `group` query heads that share one KV head, for m consecutive tokens of
// one sequence (a prefill tile, or m = 1 at decode): every K/V row of a block is read once
// (and widened once from bf16, or dequantized once from int8) for all m · group query rows.
//
//   out[t, g] = Σ_{s <= first_pos + t} softmax_s(scale · q[t, g] · K[s]) · V[s]
//
// in fp32 with an online softmax over the blocks in ascending order; a query row's result
// depends on nothing but its own inputs (not on m, group or the thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace xds::kernels {

// One KV head of one layer of a sequence's paged cache.
struct GqaKvView {
  const std::byte* base = nullptr;       // block 0 of the storage
  int64_t block_bytes = 0;               // bytes from one block to the next
  const int32_t* block_table = nullptr;  // position s: block block_table[s / block_size]
  int64_t block_size = 0;                // rows per block
  int64_t k_offset = 0;       // bytes from a block's start to row 0 of the head's K plane
  int64_t v_offset = 0;       // ... of its V plane
  int64_t head_dim = 0;       // Dh: elements of a row; rows dense (Dh · element bytes apart)
  DType dtype = DType::kF32;  // kF32, kBF16, or kI8 (then a row is q · its scale)
  // kI8: bytes from a block's start to row 0 of the head's K / V scale plane (one f32 a row)
  int64_t k_scale_offset = 0;
  int64_t v_scale_offset = 0;
};

// The query rows of one call and where their outputs go.
struct GqaQueries {
  const float* q = nullptr;  // row (t, g), t < m, g < group: q + t·ld + g·head_dim, [head_dim]
  int64_t ld = 0;            // floats from one token's rows to the next
  int64_t m = 0;             // tokens
  int64_t group = 0;         // query heads sharing the KV head
  int64_t first_pos = 0;     // token t attends to context rows [0, first_pos + t]
  float scale = 1.0f;        // softmax scale (1/sqrt(head_dim))
  float* out = nullptr;      // row (t, g): out + t·out_ld + g·head_dim, [head_dim]
  int64_t out_ld = 0;
};

// Floats of scratch gqa_attention needs for m tokens × group heads.
int64_t gqa_scratch_floats(int64_t m, int64_t group, int64_t block_size, int64_t head_dim);

// The attention above; scratch holds gqa_scratch_floats(...) floats. The cache must hold
// rows [0, first_pos + m).
void gqa_attention(const GqaQueries& q, const GqaKvView& kv, float* scratch);

// Rotate-half rotary embedding of one head x[0..dim) (Hugging Face's rotate_half convention:
// element i pairs with element i + dim/2) at the angles of a table in the interleaved layout
// (model/rope.h): cos_sin[2i] = cos(p·f_i)·m, cos_sin[2i+1] = sin(p·f_i)·m for i < dim/2:
//   x'[i]         = x[i] · cos_i − x[i + dim/2] · sin_i
//   x'[i + dim/2] = x[i + dim/2] · cos_i + x[i] · sin_i
void rope_rotate_half(float* x, int64_t dim, const float* cos_sin);

}  // namespace xds::kernels

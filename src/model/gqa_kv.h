// The paged KV cache of grouped-query attention (Qwen3-MoE): the layout of its planes in a
// KvStorage and the attention kernel's view of one KV head (kernels/cpu/gqa_attention.h).
//
// Planes of a layer, every row head_dim elements of f32, bf16 or int8, dense:
//   plane h          (h < KV): K of KV head h (after k_norm and RoPE)
//   plane KV + h              : V of KV head h
// and for int8 (int8_quant.h's rule: q = round(x / s), s = absmax(row) / 127) one f32 a row:
//   plane 2·KV + h            : the scale of K of head h
//   plane 3·KV + h            : the scale of V of head h
// so that in a block the block_size rows of one head's K lie together
// ([block_size, head_dim], one chunk of KvStorage's block-major layout, 64-byte aligned):
// a decode step reads each head's chunk in one sweep. A row of every plane is written once,
// at its position, by the step that computes it.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/gqa_attention.h"
#include "model/causal_lm.h"
#include "model/kv_storage.h"
#include "tensor/dtype.h"

namespace xds {

// dtype kF32, kBF16 or kI8.
KvLayout gqa_kv_layout(int64_t layers, int64_t kv_heads, int64_t head_dim, DType dtype);

// Whether `layout` is a GQA layout as above.
bool is_gqa_kv_layout(const KvLayout& layout);

// KV head `head` of `layer` for a sequence whose position s is in block blocks[s / block_size]
// (the span must outlive the view).
kernels::GqaKvView gqa_kv_view(const KvStorage& kv, int64_t layer, int64_t head,
                               std::span<const int32_t> blocks);

// Stores K and V of position `slot` of block `block` in `layer`: k, v [KV, head_dim] fp32,
// rounded to bf16 (round to nearest even) in bf16 planes, quantized per row in int8 ones.
void gqa_kv_write(KvStorage& kv, int64_t layer, int32_t block, int64_t slot, const float* k,
                  const float* v);

// The elements a GQA cache holds for --kv-cache-dtype `kv` at compute dtype `compute`: INT8
// when asked, BF16 when asked or (auto) in the bf16 compute mode, else F32.
DType gqa_kv_dtype(KvCacheDType kv, ComputeDType compute);

}  // namespace xds

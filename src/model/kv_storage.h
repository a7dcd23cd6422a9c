// KvStorage: the rows of the KV cache, block-major. Which blocks are in use, and by whom, is
// the BlockAllocator's business; this holds bytes only.
//
// A layer's cache is a list of planes, each {dtype, elements per row, row bytes}. Today's MLA
// cache (mla_kv_layout) has two:
//   latent: C = kv_lora_rank elements of f32 or bf16, row stride padded_latent_stride(C)
//           (an odd number of cache lines)
//   rope:   Dr = qk_rope_head_dim elements of the same dtype, rows dense
// An INT8 latent (mla_int8_kv_layout) is three planes:
//   latent: C int8 elements, q = round(c / s) with s = absmax(c) / 127 (int8_quant.h's
//           rule), row stride padded_latent_stride(C, 1) bytes (an odd number of lines)
//   scale:  1 f32 element, s
//   rope:   Dr elements of f32 or bf16, as the float layouts' rope plane
//
// Layout, block-major: [num_blocks][layers][planes][block_size rows]
//   block b            at base + b · block_bytes()
//   plane p of layer l at block + l · layer_bytes + plane_offset[p]
//   row r of the plane at that + r · planes[p].row_bytes
//   plane chunk bytes   = block_size · row_bytes, rounded up to 64 (each chunk on a line)
//   layer_bytes        = Σ_p chunk bytes;  block_bytes() = layers · layer_bytes
// A block of every layer (MTP layers included) is one contiguous range of block_bytes():
// moving a set of blocks to another process is one copy per block.
//
// Memory: owned (create: huge pages, zero-filled) or the caller's (wrap: e.g. a region
// registered with XCCL; not cleared: rows are read only once written).
//
// Thread-safety: none inside. Several threads may write distinct rows at once, and read
// rows no thread is writing. Block ids are not checked beyond XDS_DCHECK: the forward pass
// checks its block tables before it writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/huge_page_buffer.h"
#include "base/status.h"
#include "kernels/cpu/mla_attention.h"
#include "tensor/dtype.h"

namespace xds {

struct KvPlane {
  DType dtype = DType::kF32;
  int64_t elements = 0;   // used elements of a row
  int64_t row_bytes = 0;  // bytes from one row to the next: >= elements · size, a multiple of size
};

// What one block row holds for a model: the same planes in every layer.
struct KvLayout {
  int64_t layers = 0;           // cache layers: decoder layers, then MTP layers
  std::vector<KvPlane> planes;  // per layer
};

// The MLA planes: latent [latent_dim] with the padded row stride, rope [rope_dim]; dtype
// kF32 or kBF16.
KvLayout mla_kv_layout(int64_t layers, int64_t latent_dim, int64_t rope_dim, DType dtype);
// The INT8 latent's three planes (above); rope_dtype kF32 or kBF16.
KvLayout mla_int8_kv_layout(int64_t layers, int64_t latent_dim, int64_t rope_dim,
                            DType rope_dtype);

struct KvStorageShape {
  KvLayout layout;
  int64_t num_blocks = 0;
  int64_t block_size = 16;  // rows (token positions) per block
};

class KvStorage {
 public:
  // InvalidArgument naming the field when the shape is not one this class can lay out.
  static Status validate(const KvStorageShape& shape);
  // Bytes of the whole storage (num_blocks · block_bytes), or -1 if it is invalid or
  // overflows int64.
  static int64_t bytes_for(const KvStorageShape& shape);

  // Owned, zero-filled memory in huge pages where the kernel gives them. ResourceExhausted,
  // naming the tokens, the layers and the bytes, when it needs more than `available_bytes`
  // (default: the machine's MemAvailable, base/memory_info.h; -1: unchecked) or the
  // allocation fails: the error a user gets for too large a cache, not the OOM killer.
  static Result<KvStorage> create(const KvStorageShape& shape, int64_t available_bytes);
  static Result<KvStorage> create(const KvStorageShape& shape);
  // The caller's memory, which must outlive the storage: 64-byte aligned and at least
  // bytes_for(shape) bytes (InvalidArgument naming both otherwise).
  static Result<KvStorage> wrap(const KvStorageShape& shape, std::span<std::byte> memory);

  const KvStorageShape& shape() const { return shape_; }
  const KvLayout& layout() const { return shape_.layout; }
  int64_t num_blocks() const { return shape_.num_blocks; }
  int64_t block_size() const { return shape_.block_size; }
  int64_t block_bytes() const { return block_bytes_; }
  int64_t bytes() const { return block_bytes_ * shape_.num_blocks; }
  std::byte* data() { return base_; }

  // Start of block b (block_bytes() bytes, every layer's planes).
  std::byte* block_ptr(int32_t b) { return base_ + b * block_bytes_; }
  const std::byte* block_ptr(int32_t b) const { return base_ + b * block_bytes_; }
  // Row 0 of plane p of `layer` in block b; rows layout().planes[p].row_bytes apart.
  std::byte* plane_ptr(int32_t b, int64_t layer, int64_t p) {
    return block_ptr(b) + layer * layer_bytes_ + plane_offset_[static_cast<size_t>(p)];
  }

  // Whether the planes are the MLA pair (mla_kv_layout) or the INT8 triple
  // (mla_int8_kv_layout) that write() and view() handle.
  bool is_mla() const { return mla_; }
  bool is_int8() const { return int8_; }
  // MLA planes: stores row `slot` of block b in `layer`: latent [latent_dim], rope
  // [rope_dim], rounded to bf16 (kernels::kv_row_to_bf16) in bf16 planes; an INT8 latent
  // quantized with its scale (kernels::quantize_row_int8).
  void write(int64_t layer, int32_t b, int64_t slot, const float* latent, const float* rope);
  // MLA planes: the attention kernels' view of `layer` for a sequence whose position s is in
  // block blocks[s / block_size] (the span must outlive the view).
  kernels::LatentKvView view(int64_t layer, std::span<const int32_t> blocks) const;

  // Block dst = block src, every layer (copy on write; src != dst).
  void copy_block(int32_t src, int32_t dst);

 private:
  KvStorage(const KvStorageShape& shape, std::byte* base);
  kernels::LatentKvView int8_view(int64_t layer, std::span<const int32_t> blocks) const;

  KvStorageShape shape_;
  HugePageBuffer owned_;  // empty for wrapped memory
  std::byte* base_ = nullptr;
  int64_t layer_bytes_ = 0, block_bytes_ = 0;
  std::vector<int64_t> plane_offset_;  // [planes] bytes from a layer's start in a block
  bool mla_ = false;
  bool int8_ = false;  // the INT8 triple (mla_ too)
};

}  // namespace xds

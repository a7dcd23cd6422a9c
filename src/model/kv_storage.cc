#include "model/kv_storage.h"

#include <cstring>
#include <new>

#include "base/memory_info.h"
#include "kernels/cpu/int8_quant.h"

namespace xds {
namespace {

constexpr int64_t kLine = 64;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// a * b, or -1 on overflow (a, b >= 0).
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? -1 : r;
}

// Bytes of one plane chunk of a block (block_size rows, rounded up to a line), or -1.
int64_t chunk_bytes(const KvPlane& p, int64_t block_size) {
  const int64_t raw = mul(p.row_bytes, block_size);
  if (raw < 0 || raw > INT64_MAX - kLine) return -1;
  return (raw + kLine - 1) / kLine * kLine;
}

// Bytes of a block's planes of one layer, or -1.
int64_t layer_bytes_for(const KvStorageShape& s) {
  int64_t total = 0;
  for (const KvPlane& p : s.layout.planes) {
    const int64_t c = chunk_bytes(p, s.block_size);
    if (c < 0 || __builtin_add_overflow(total, c, &total)) return -1;
  }
  return total;
}

bool mla_pair(const KvLayout& l) {
  if (l.planes.size() != 2) return false;
  const KvPlane& lat = l.planes[0];
  const KvPlane& rope = l.planes[1];
  const int64_t size = dtype_size(lat.dtype);
  return (lat.dtype == DType::kF32 || lat.dtype == DType::kBF16) && rope.dtype == lat.dtype &&
         rope.row_bytes == rope.elements * size;
}

// The INT8 triple: int8 latent, one f32 scale, a dense f32 or bf16 rope plane.
bool mla_int8_triple(const KvLayout& l) {
  if (l.planes.size() != 3) return false;
  const KvPlane& lat = l.planes[0];
  const KvPlane& scale = l.planes[1];
  const KvPlane& rope = l.planes[2];
  return lat.dtype == DType::kI8 && scale.dtype == DType::kF32 && scale.elements == 1 &&
         scale.row_bytes == 4 && (rope.dtype == DType::kF32 || rope.dtype == DType::kBF16) &&
         rope.row_bytes == rope.elements * dtype_size(rope.dtype);
}

}  // namespace

KvLayout mla_int8_kv_layout(int64_t layers, int64_t latent_dim, int64_t rope_dim,
                            DType rope_dtype) {
  KvLayout l;
  l.layers = layers;
  l.planes.push_back({DType::kI8, latent_dim, kernels::padded_latent_stride(latent_dim, 1)});
  l.planes.push_back({DType::kF32, 1, 4});
  l.planes.push_back({rope_dtype, rope_dim, rope_dim * dtype_size(rope_dtype)});
  return l;
}

KvLayout mla_kv_layout(int64_t layers, int64_t latent_dim, int64_t rope_dim, DType dtype) {
  const int64_t size = dtype_size(dtype);
  KvLayout l;
  l.layers = layers;
  l.planes.push_back({dtype, latent_dim, kernels::padded_latent_stride(latent_dim, size) * size});
  l.planes.push_back({dtype, rope_dim, rope_dim * size});
  return l;
}

Status KvStorage::validate(const KvStorageShape& s) {
  if (s.layout.layers <= 0 || s.num_blocks <= 0 || s.block_size <= 0) {
    return invalid_argument("KV storage: layers {}, blocks {}, block size {}: each must be > 0",
                            s.layout.layers, s.num_blocks, s.block_size);
  }
  if (s.layout.planes.empty()) return invalid_argument("KV storage: a layer has no planes");
  for (size_t i = 0; i < s.layout.planes.size(); ++i) {
    const KvPlane& p = s.layout.planes[i];
    const int64_t size = dtype_size(p.dtype);
    if (p.elements < 0 || p.row_bytes < 0 || p.row_bytes % size != 0 ||
        p.row_bytes / size < p.elements) {
      return invalid_argument(
          "KV storage: plane {} ({} x {}): row bytes {} must be a multiple of {} holding the "
          "elements",
          i, p.elements, dtype_name(p.dtype), p.row_bytes, size);
    }
  }
  if (bytes_for(s) < 0) {
    return resource_exhausted(
        "KV storage of {} blocks of {} rows x {} layers needs more than "
        "2^63 bytes",
        s.num_blocks, s.block_size, s.layout.layers);
  }
  if (s.num_blocks > INT32_MAX) {
    return invalid_argument("KV storage: {} blocks: block ids are int32", s.num_blocks);
  }
  return {};
}

int64_t KvStorage::bytes_for(const KvStorageShape& s) {
  if (s.layout.layers < 0 || s.num_blocks < 0 || s.block_size < 0) return -1;
  for (const KvPlane& p : s.layout.planes) {
    if (p.row_bytes < 0) return -1;
  }
  const int64_t layer = layer_bytes_for(s);
  if (layer < 0) return -1;
  const int64_t block = mul(layer, s.layout.layers);
  return block < 0 ? -1 : mul(block, s.num_blocks);
}

KvStorage::KvStorage(const KvStorageShape& shape, std::byte* base)
    : shape_(shape), base_(base), layer_bytes_(layer_bytes_for(shape)) {
  block_bytes_ = layer_bytes_ * shape.layout.layers;
  int64_t at = 0;
  for (const KvPlane& p : shape.layout.planes) {
    plane_offset_.push_back(at);
    at += chunk_bytes(p, shape.block_size);
  }
  int8_ = mla_int8_triple(shape.layout);
  mla_ = int8_ || mla_pair(shape.layout);
}

Result<KvStorage> KvStorage::create(const KvStorageShape& shape) {
  return create(shape, available_memory_bytes());
}

Result<KvStorage> KvStorage::create(const KvStorageShape& shape, int64_t available_bytes) {
  XDS_RETURN_IF_ERROR(validate(shape));
  const int64_t bytes = bytes_for(shape);
  const int64_t tokens = shape.num_blocks * shape.block_size;  // no overflow: bytes did not
  if (available_bytes >= 0 && bytes > available_bytes) {
    return resource_exhausted(
        "KV cache for {} tokens x {} layers needs {:.2f} GiB, but only {:.2f} GiB of memory is "
        "available: ask for fewer tokens",
        tokens, shape.layout.layers, bytes / kGiB, available_bytes / kGiB);
  }
  try {
    HugePageBuffer memory(static_cast<size_t>(bytes));  // zero-filled
    KvStorage s(shape, memory.as<std::byte>());
    s.owned_ = std::move(memory);
    return s;
  } catch (const std::bad_alloc&) {
    return resource_exhausted("KV cache for {} tokens x {} layers: allocating {:.2f} GiB failed",
                              tokens, shape.layout.layers, bytes / kGiB);
  }
}

Result<KvStorage> KvStorage::wrap(const KvStorageShape& shape, std::span<std::byte> memory) {
  XDS_RETURN_IF_ERROR(validate(shape));
  const int64_t bytes = bytes_for(shape);
  if (static_cast<int64_t>(memory.size()) < bytes) {
    return invalid_argument("KV storage: {} blocks need {} bytes, the memory given has {}",
                            shape.num_blocks, bytes, memory.size());
  }
  if (reinterpret_cast<uintptr_t>(memory.data()) % kLine != 0) {
    return invalid_argument("KV storage: the memory given at {} is not {}-byte aligned",
                            static_cast<const void*>(memory.data()), kLine);
  }
  return KvStorage(shape, memory.data());
}

void KvStorage::write(int64_t layer, int32_t b, int64_t slot, const float* latent,
                      const float* rope) {
  XDS_DCHECK(mla_ && b >= 0 && b < shape_.num_blocks && slot >= 0 && slot < shape_.block_size &&
                 layer >= 0 && layer < shape_.layout.layers,
             "KV write: layer {} block {} slot {}", layer, b, slot);
  const KvPlane& lp = shape_.layout.planes[0];
  const int64_t rope_plane = int8_ ? 2 : 1;
  const KvPlane& rp = shape_.layout.planes[static_cast<size_t>(rope_plane)];
  std::byte* lat_row = plane_ptr(b, layer, 0) + slot * lp.row_bytes;
  std::byte* rope_row = plane_ptr(b, layer, rope_plane) + slot * rp.row_bytes;
  if (int8_) {
    const float s =
        kernels::quantize_row_int8(latent, lp.elements, reinterpret_cast<int8_t*>(lat_row));
    std::memcpy(plane_ptr(b, layer, 1) + slot * 4, &s, sizeof s);
    if (rp.elements == 0) return;
    if (rp.dtype == DType::kBF16) {
      kernels::kv_row_to_bf16(rope, rp.elements, reinterpret_cast<uint16_t*>(rope_row));
    } else {
      std::memcpy(rope_row, rope, sizeof(float) * static_cast<size_t>(rp.elements));
    }
    return;
  }
  if (lp.dtype == DType::kBF16) {
    kernels::kv_row_to_bf16(latent, lp.elements, reinterpret_cast<uint16_t*>(lat_row));
    if (rp.elements > 0)
      kernels::kv_row_to_bf16(rope, rp.elements, reinterpret_cast<uint16_t*>(rope_row));
    return;
  }
  std::memcpy(lat_row, latent, sizeof(float) * static_cast<size_t>(lp.elements));
  if (rp.elements > 0)
    std::memcpy(rope_row, rope, sizeof(float) * static_cast<size_t>(rp.elements));
}

kernels::LatentKvView KvStorage::view(int64_t layer, std::span<const int32_t> blocks) const {
  XDS_CHECK(mla_, "KvStorage::view needs the MLA planes (mla_kv_layout)");
  if (int8_) return int8_view(layer, blocks);
  const KvPlane& lp = shape_.layout.planes[0];
  const KvPlane& rp = shape_.layout.planes[1];
  const int64_t size = dtype_size(lp.dtype);
  const std::byte* lat = base_ + layer * layer_bytes_ + plane_offset_[0];
  const std::byte* rope = base_ + layer * layer_bytes_ + plane_offset_[1];
  kernels::LatentKvView v;
  if (lp.dtype == DType::kBF16) {
    v.latent16 = reinterpret_cast<const uint16_t*>(lat);
    v.rope16 = reinterpret_cast<const uint16_t*>(rope);
  } else {
    v.latent = reinterpret_cast<const float*>(lat);
    v.rope = reinterpret_cast<const float*>(rope);
  }
  v.block_table = blocks.data();
  v.block_size = shape_.block_size;
  v.latent_dim = lp.elements;
  v.rope_dim = rp.elements;
  v.latent_ld = lp.row_bytes / size;
  v.latent_block_stride = block_bytes_ / size;
  v.rope_block_stride = block_bytes_ / size;
  return v;
}

kernels::LatentKvView KvStorage::int8_view(int64_t layer, std::span<const int32_t> blocks) const {
  const KvPlane& lp = shape_.layout.planes[0];
  const KvPlane& rp = shape_.layout.planes[2];
  const std::byte* at = base_ + layer * layer_bytes_;
  kernels::LatentKvView v;
  v.latent8 = reinterpret_cast<const int8_t*>(at + plane_offset_[0]);
  v.latent_scale = reinterpret_cast<const float*>(at + plane_offset_[1]);
  if (rp.dtype == DType::kBF16) {
    v.rope16 = reinterpret_cast<const uint16_t*>(at + plane_offset_[2]);
  } else {
    v.rope = reinterpret_cast<const float*>(at + plane_offset_[2]);
  }
  v.block_table = blocks.data();
  v.block_size = shape_.block_size;
  v.latent_dim = lp.elements;
  v.rope_dim = rp.elements;
  v.latent_ld = lp.row_bytes;
  v.latent_block_stride = block_bytes_;
  v.scale_block_stride = block_bytes_ / 4;
  v.rope_block_stride = block_bytes_ / dtype_size(rp.dtype);
  return v;
}

void KvStorage::copy_block(int32_t src, int32_t dst) {
  XDS_CHECK(
      src >= 0 && src < shape_.num_blocks && dst >= 0 && dst < shape_.num_blocks && src != dst,
      "KV copy_block: {} -> {} of {} blocks", src, dst, shape_.num_blocks);
  std::memcpy(block_ptr(dst), block_ptr(src), static_cast<size_t>(block_bytes_));
}

}  // namespace xds

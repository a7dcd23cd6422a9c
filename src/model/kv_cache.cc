#include "model/kv_cache.h"

#include <cstring>
#include <new>

#include "base/memory_info.h"

namespace xds {

int64_t KvCache::bytes_for(const KvCacheShape& shape) {
  const int64_t size = dtype_size(shape.dtype);
  const int64_t row = kernels::padded_latent_stride(shape.latent_dim, size) + shape.rope_dim;
  int64_t bytes = size;
  for (const int64_t f : {shape.layers, shape.num_blocks, shape.block_size, row}) {
    if (f < 0 || __builtin_mul_overflow(bytes, f, &bytes)) return -1;
  }
  return bytes;
}

Result<KvCache> KvCache::create(const KvCacheShape& shape) {
  return create(shape, available_memory_bytes());
}

Result<KvCache> KvCache::create(const KvCacheShape& shape, int64_t available_bytes) {
  if (shape.layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.latent_dim <= 0 || shape.rope_dim < 0) {
    return invalid_argument(
        "KV cache: layers {}, blocks {}, block size {}, latent {}, rope {}: each must be > 0 "
        "(rope >= 0)",
        shape.layers, shape.num_blocks, shape.block_size, shape.latent_dim, shape.rope_dim);
  }
  if (shape.dtype != DType::kF32 && shape.dtype != DType::kBF16) {
    return invalid_argument("KV cache: dtype {}: must be F32 or BF16", dtype_name(shape.dtype));
  }
  if (shape.dtype == DType::kBF16 && !kernels::absorbed_bf16_available()) {
    return invalid_argument(
        "KV cache: a BF16 cache is read only by the bf16 attention kernel, which needs "
        "AVX512_BF16 and the AVX-512 panel ISA, which this CPU or build lacks: use F32");
  }
  const int64_t bytes = bytes_for(shape);
  if (bytes < 0) {
    return resource_exhausted(
        "KV cache of {} blocks of {} tokens x {} layers needs more than 2^63 bytes",
        shape.num_blocks, shape.block_size, shape.layers);
  }
  const int64_t tokens = shape.num_blocks * shape.block_size;  // no overflow: bytes did not
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (available_bytes >= 0 && bytes > available_bytes) {
    return resource_exhausted(
        "KV cache for {} tokens x {} layers needs {:.2f} GiB, but only {:.2f} GiB of memory is "
        "available: ask for fewer tokens",
        tokens, shape.layers, bytes / kGiB, available_bytes / kGiB);
  }
  try {
    return KvCache(shape);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("KV cache for {} tokens x {} layers: allocating {:.2f} GiB failed",
                              tokens, shape.layers, bytes / kGiB);
  }
}

KvCache::KvCache(const KvCacheShape& shape)
    : shape_(shape),
      latent_ld_(kernels::padded_latent_stride(shape.latent_dim, dtype_size(shape.dtype))) {
  const size_t rows = static_cast<size_t>(shape.layers * shape.num_blocks * shape.block_size);
  const size_t latent = rows * static_cast<size_t>(latent_ld_);
  const size_t rope = rows * static_cast<size_t>(shape.rope_dim);
  const size_t element = static_cast<size_t>(dtype_size(shape.dtype));
  latent_ = HugePageBuffer(latent * element);  // zero-filled
  rope_ = HugePageBuffer(rope * element);
  for (int64_t b = shape.num_blocks - 1; b >= 0; --b) free_list_.push_back(static_cast<int32_t>(b));
}

int64_t KvCache::add_sequence() {
  for (size_t i = 0; i < live_.size(); ++i) {
    if (!live_[i]) {
      live_[i] = true;
      return static_cast<int64_t>(i);
    }
  }
  live_.push_back(true);
  tables_.emplace_back();
  return static_cast<int64_t>(live_.size() - 1);
}

void KvCache::free_sequence(int64_t seq) {
  XDS_CHECK(seq >= 0 && seq < static_cast<int64_t>(live_.size()) && live_[seq], "bad seq {}", seq);
  for (int32_t b : tables_[seq]) free_list_.push_back(b);
  tables_[seq].clear();
  live_[seq] = false;
}

Status KvCache::reserve(int64_t seq, int64_t length) {
  XDS_CHECK(seq >= 0 && seq < static_cast<int64_t>(live_.size()) && live_[seq], "bad seq {}", seq);
  auto& table = tables_[seq];
  const int64_t need = (length + shape_.block_size - 1) / shape_.block_size;
  const int64_t missing = need - static_cast<int64_t>(table.size());
  if (missing > static_cast<int64_t>(free_list_.size())) {
    return resource_exhausted("KV cache: sequence needs {} more blocks of {} tokens, {} free",
                              missing, shape_.block_size, free_list_.size());
  }
  for (int64_t i = 0; i < missing; ++i) {
    table.push_back(free_list_.back());
    free_list_.pop_back();
  }
  return {};
}

int64_t KvCache::capacity(int64_t seq) const {
  return static_cast<int64_t>(tables_[seq].size()) * shape_.block_size;
}

int64_t KvCache::slot_index(int64_t seq, int64_t pos) const {
  const auto& table = tables_[seq];
  XDS_DCHECK(pos / shape_.block_size < static_cast<int64_t>(table.size()), "pos {} beyond", pos);
  return table[pos / shape_.block_size] * shape_.block_size + pos % shape_.block_size;
}

void KvCache::write(int64_t layer, int64_t seq, int64_t pos, const float* latent,
                    const float* rope) {
  const int64_t row = layer * shape_.num_blocks * shape_.block_size + slot_index(seq, pos);
  const int64_t lat = shape_.latent_dim, dr = shape_.rope_dim;
  if (shape_.dtype == DType::kBF16) {
    kernels::kv_row_to_bf16(latent, lat, latent_.as<uint16_t>() + row * latent_ld_);
    if (dr > 0) kernels::kv_row_to_bf16(rope, dr, rope_.as<uint16_t>() + row * dr);
    return;
  }
  std::memcpy(latent_.as<float>() + row * latent_ld_, latent,
              sizeof(float) * static_cast<size_t>(lat));
  if (dr > 0)
    std::memcpy(rope_.as<float>() + row * dr, rope, sizeof(float) * static_cast<size_t>(dr));
}

kernels::LatentKvView KvCache::view(int64_t layer, int64_t seq) const {
  const int64_t layer_base = layer * shape_.num_blocks * shape_.block_size;
  kernels::LatentKvView v;
  if (shape_.dtype == DType::kBF16) {
    v.latent16 = latent_.as<uint16_t>() + layer_base * latent_ld_;
    v.rope16 = rope_.as<uint16_t>() + layer_base * shape_.rope_dim;
  } else {
    v.latent = latent_.as<float>() + layer_base * latent_ld_;
    v.rope = rope_.as<float>() + layer_base * shape_.rope_dim;
  }
  v.block_table = tables_[seq].data();
  v.block_size = shape_.block_size;
  v.latent_dim = shape_.latent_dim;
  v.rope_dim = shape_.rope_dim;
  v.latent_ld = latent_ld_;
  return v;
}

}  // namespace xds

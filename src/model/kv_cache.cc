#include "model/kv_cache.h"

#include <utility>

#include "base/memory_info.h"

namespace xds {

KvStorageShape KvCacheShape::storage_shape() const {
  KvStorageShape s;
  s.layout = dtype == DType::kI8 ? mla_int8_kv_layout(layers, latent_dim, rope_dim, rope_dtype)
                                  : mla_kv_layout(layers, latent_dim, rope_dim, dtype);
  s.num_blocks = num_blocks;
  s.block_size = block_size;
  return s;
}

int64_t KvCache::bytes_for(const KvCacheShape& shape) {
  if (shape.latent_dim < 0 || shape.rope_dim < 0) return -1;
  return KvStorage::bytes_for(shape.storage_shape());
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
  if (shape.dtype != DType::kF32 && shape.dtype != DType::kBF16 && shape.dtype != DType::kI8) {
    return invalid_argument("KV cache: dtype {}: must be F32, BF16 or I8",
                            dtype_name(shape.dtype));
  }
  if (shape.dtype == DType::kI8 && shape.rope_dtype != DType::kF32 &&
      shape.rope_dtype != DType::kBF16) {
    return invalid_argument("KV cache: an I8 latent's rope plane must be F32 or BF16, got {}",
                            dtype_name(shape.rope_dtype));
  }
  const bool bf16_plane = shape.dtype == DType::kBF16 ||
                          (shape.dtype == DType::kI8 && shape.rope_dtype == DType::kBF16);
  if (bf16_plane && !kernels::absorbed_bf16_available()) {
    return invalid_argument(
        "KV cache: a BF16 cache is read only by the bf16 attention kernel, which needs "
        "AVX512_BF16 and the AVX-512 panel ISA, which this CPU or build lacks: use F32");
  }
  return create(shape.storage_shape(), available_bytes);
}

Result<KvCache> KvCache::create(const KvStorageShape& shape, int64_t available_bytes) {
  XDS_ASSIGN_OR_RETURN(KvStorage storage, KvStorage::create(shape, available_bytes));
  return KvCache(std::move(storage));
}

KvCache::KvCache(KvStorage storage)
    : storage_(std::move(storage)), allocator_(static_cast<int32_t>(storage_.num_blocks())) {}

void KvCache::check_seq(int64_t seq) const {
  XDS_CHECK(seq >= 0 && seq < static_cast<int64_t>(live_.size()) && live_[seq], "bad seq {}", seq);
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
  check_seq(seq);
  allocator_.unref(tables_[seq]);
  tables_[seq].clear();
  live_[seq] = false;
}

Status KvCache::reserve(int64_t seq, int64_t length) {
  check_seq(seq);
  auto& table = tables_[seq];
  const int64_t bs = storage_.block_size();
  const int64_t need = (length + bs - 1) / bs;
  const int64_t missing = need - static_cast<int64_t>(table.size());
  if (missing <= 0) return {};
  if (missing > allocator_.free_count()) {
    return resource_exhausted("KV cache: sequence needs {} more blocks of {} tokens, {} free",
                              missing, bs, allocator_.free_count());
  }
  return allocator_.allocate(missing, table);
}

void KvCache::truncate(int64_t seq, int64_t length) {
  check_seq(seq);
  XDS_CHECK(length >= 0, "KvCache::truncate: length {}", length);
  auto& table = tables_[seq];
  const int64_t bs = storage_.block_size();
  const size_t keep = static_cast<size_t>((length + bs - 1) / bs);
  if (keep >= table.size()) return;
  allocator_.unref(std::span<const int32_t>(table).subspan(keep));
  table.resize(keep);
}

int64_t KvCache::capacity(int64_t seq) const {
  check_seq(seq);
  return static_cast<int64_t>(tables_[seq].size()) * storage_.block_size();
}

std::span<const int32_t> KvCache::blocks(int64_t seq) const {
  check_seq(seq);
  return tables_[seq];
}

Result<TokenChunk> KvCache::chunk(int64_t seq, int64_t start_pos, std::span<const int32_t> tokens,
                                  bool all_logits) {
  XDS_RETURN_IF_ERROR(reserve(seq, start_pos + static_cast<int64_t>(tokens.size())));
  TokenChunk c;
  c.start_pos = start_pos;
  c.tokens = tokens;
  c.blocks = tables_[seq];
  c.all_logits = all_logits;
  return c;
}

Result<MtpChunk> KvCache::mtp_chunk(int64_t seq, int64_t start_pos,
                                    std::span<const int32_t> next_tokens, const float* hidden) {
  XDS_RETURN_IF_ERROR(reserve(seq, start_pos + static_cast<int64_t>(next_tokens.size())));
  MtpChunk c;
  c.start_pos = start_pos;
  c.next_tokens = next_tokens;
  c.hidden = hidden;
  c.blocks = tables_[seq];
  return c;
}

void KvCache::write(int64_t layer, int64_t seq, int64_t pos, const float* latent,
                    const float* rope) {
  const auto& table = tables_[seq];
  const int64_t bs = storage_.block_size();
  XDS_DCHECK(pos / bs < static_cast<int64_t>(table.size()), "pos {} beyond", pos);
  storage_.write(layer, table[pos / bs], pos % bs, latent, rope);
}

kernels::LatentKvView KvCache::view(int64_t layer, int64_t seq) const {
  return storage_.view(layer, tables_[seq]);
}

}  // namespace xds

#include "model/kv_cache.h"

namespace xds {

KvCache::KvCache(const KvCacheShape& shape)
    : shape_(shape), latent_ld_(kernels::padded_latent_stride(shape.latent_dim)) {
  const size_t per_layer = static_cast<size_t>(shape.num_blocks * shape.block_size);
  latent_.assign(per_layer * shape.layers * latent_ld_, 0.0f);
  rope_.assign(per_layer * shape.layers * shape.rope_dim, 0.0f);
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

float* KvCache::latent_slot(int64_t layer, int64_t seq, int64_t pos) {
  const int64_t layer_base = layer * shape_.num_blocks * shape_.block_size;
  return latent_.data() + (layer_base + slot_index(seq, pos)) * latent_ld_;
}

float* KvCache::rope_slot(int64_t layer, int64_t seq, int64_t pos) {
  const int64_t layer_base = layer * shape_.num_blocks * shape_.block_size;
  return rope_.data() + (layer_base + slot_index(seq, pos)) * shape_.rope_dim;
}

kernels::LatentKvView KvCache::view(int64_t layer, int64_t seq) const {
  const int64_t layer_base = layer * shape_.num_blocks * shape_.block_size;
  kernels::LatentKvView v;
  v.latent = latent_.data() + layer_base * latent_ld_;
  v.rope = rope_.data() + layer_base * shape_.rope_dim;
  v.block_table = tables_[seq].data();
  v.block_size = shape_.block_size;
  v.latent_dim = shape_.latent_dim;
  v.rope_dim = shape_.rope_dim;
  v.latent_ld = latent_ld_;
  return v;
}

}  // namespace xds

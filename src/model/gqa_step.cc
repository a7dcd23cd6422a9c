#include "model/gqa_step.h"

#include <algorithm>

#include "base/grow.h"
#include "kernels/cpu/gqa_attention.h"
#include "model/gqa_kv.h"

namespace xds {
namespace {

// Tokens of a chunk that one attention item takes: a prefill tile reads each K/V block once
// for all its tokens' query heads.
constexpr int64_t kTokenTile = 16;

}  // namespace

void GqaStep::clear() {
  chunks_.clear();
  pos_.clear();
  n_ = 0;
}

int64_t GqaStep::max_end() const {
  int64_t end = 0;
  for (const GqaChunk& ch : chunks_) end = std::max(end, ch.start_pos + ch.count);
  return end;
}

Status GqaStep::append(size_t index, int64_t start_pos, std::span<const int32_t> tokens,
                       std::span<const int32_t> blocks, const KvStorage& kv, int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return invalid_argument("chunk {}: token {} is id {}, out of range [0, {})", index, i,
                              tokens[i], vocab_size);
    }
  }
  const int64_t count = static_cast<int64_t>(tokens.size());
  if (start_pos < 0) return invalid_argument("chunk {}: start position {} < 0", index, start_pos);
  const int64_t end = start_pos + count, bs = kv.block_size();
  const int64_t need = (end + bs - 1) / bs;
  if (static_cast<int64_t>(blocks.size()) < need) {
    return invalid_argument(
        "chunk {}: positions [{}, {}) need {} blocks of {} rows, its block table has {}", index,
        start_pos, end, need, bs, blocks.size());
  }
  for (int64_t i = 0; i < need; ++i) {
    if (blocks[i] < 0 || blocks[i] >= kv.num_blocks()) {
      return invalid_argument("chunk {}: block table entry {} is block {}, outside [0, {})", index,
                              i, blocks[i], kv.num_blocks());
    }
  }
  chunks_.push_back({blocks, start_pos, n_, count});
  for (int64_t i = 0; i < count; ++i) pos_.push_back(start_pos + i);
  n_ += count;
  return {};
}

Status check_gqa_storage(const KvLayout& want, const KvStorage& kv, int64_t kv_heads,
                         int64_t head_dim) {
  const KvLayout& have = kv.layout();
  const auto same = [](const KvPlane& a, const KvPlane& b) {
    return a.dtype == b.dtype && a.elements == b.elements && a.row_bytes == b.row_bytes;
  };
  if (have.layers < want.layers || have.planes.size() != want.planes.size() ||
      !std::equal(want.planes.begin(), want.planes.end(), have.planes.begin(), same)) {
    return invalid_argument(
        "KV storage of {} layers x {} planes does not fit this model: {} layers of {} GQA planes "
        "(K and V of {} KV heads) of {} x {}",
        have.layers, have.planes.size(), want.layers, want.planes.size(), kv_heads, head_dim,
        dtype_name(want.planes[0].dtype));
  }
  return {};
}

void GqaAttention::run(const GqaStep& step, KvStorage& kv, const GqaLayerIo& io, ThreadPool& pool) {
  const int64_t dh = io.head_dim, group = io.heads / io.kv_heads;
  const int64_t q_width = io.heads * dh, kv_width = io.kv_heads * dh;
  const int64_t bs = kv.block_size();
  const std::vector<GqaChunk>& chunks = step.chunks();
  for (const GqaChunk& ch : chunks) {
    for (int64_t i = 0; i < ch.count; ++i) {
      const int64_t p = ch.start_pos + i, t = ch.begin + i;
      gqa_kv_write(kv, io.layer, ch.blocks[p / bs], p % bs, io.k + t * kv_width,
                   io.v + t * kv_width);
    }
  }
  // Items: (chunk, KV head, tile of up to kTokenTile tokens), over the pool.
  items_.clear();
  for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c) {
    for (int64_t first = 0; first < chunks[c].count; first += kTokenTile) {
      for (int64_t h = 0; h < io.kv_heads; ++h)
        items_.push_back({c, h, first, std::min(kTokenTile, chunks[c].count - first)});
    }
  }
  const int64_t per_thread = kernels::gqa_scratch_floats(kTokenTile, group, bs, dh);
  float* scratch_all = grow(scratch_, per_thread * pool.num_threads());
  pool.parallel_for(static_cast<int64_t>(items_.size()), [&](int64_t i0, int64_t i1, int thread) {
    float* scratch = scratch_all + per_thread * thread;
    for (int64_t i = i0; i < i1; ++i) {
      const Item& it = items_[static_cast<size_t>(i)];
      const GqaChunk& ch = chunks[static_cast<size_t>(it.chunk)];
      const int64_t t = ch.begin + it.first;
      kernels::GqaQueries gq;
      gq.q = io.q + t * q_width + it.head * group * dh;
      gq.ld = q_width;
      gq.m = it.count;
      gq.group = group;
      gq.first_pos = ch.start_pos + it.first;
      gq.scale = io.scale;
      gq.out = io.out + t * q_width + it.head * group * dh;
      gq.out_ld = q_width;
      kernels::gqa_attention(gq, gqa_kv_view(kv, io.layer, it.head, ch.blocks), scratch);
    }
  });
}

}  // namespace xds

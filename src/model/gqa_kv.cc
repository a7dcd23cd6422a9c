#include "model/gqa_kv.h"

#include <cstring>

#include "base/bf16.h"
#include "base/check.h"

namespace xds {

KvLayout gqa_kv_layout(int64_t layers, int64_t kv_heads, int64_t head_dim, DType dtype) {
  XDS_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "GQA cache dtype {}",
            dtype_name(dtype));
  KvLayout l;
  l.layers = layers;
  const KvPlane plane{dtype, head_dim, head_dim * dtype_size(dtype)};
  l.planes.assign(static_cast<size_t>(2 * kv_heads), plane);
  return l;
}

bool is_gqa_kv_layout(const KvLayout& l) {
  if (l.planes.empty() || l.planes.size() % 2 != 0) return false;
  const KvPlane& p0 = l.planes[0];
  if (p0.dtype != DType::kF32 && p0.dtype != DType::kBF16) return false;
  for (const KvPlane& p : l.planes) {
    if (p.dtype != p0.dtype || p.elements != p0.elements ||
        p.row_bytes != p0.elements * dtype_size(p0.dtype))
      return false;
  }
  return true;
}

kernels::GqaKvView gqa_kv_view(const KvStorage& kv, int64_t layer, int64_t head,
                               std::span<const int32_t> blocks) {
  const KvLayout& l = kv.layout();
  const int64_t kv_heads = static_cast<int64_t>(l.planes.size()) / 2;
  // plane_ptr only adds offsets (it is non-const because it hands out writable rows).
  KvStorage& rows = const_cast<KvStorage&>(kv);
  const std::byte* block0 = kv.block_ptr(0);
  kernels::GqaKvView v;
  v.base = block0;
  v.block_bytes = kv.block_bytes();
  v.block_table = blocks.data();
  v.block_size = kv.block_size();
  v.k_offset = rows.plane_ptr(0, layer, head) - block0;
  v.v_offset = rows.plane_ptr(0, layer, kv_heads + head) - block0;
  v.head_dim = l.planes[0].elements;
  v.dtype = l.planes[0].dtype;
  return v;
}

void gqa_kv_write(KvStorage& kv, int64_t layer, int32_t block, int64_t slot, const float* k,
                  const float* v) {
  const KvLayout& l = kv.layout();
  const int64_t kv_heads = static_cast<int64_t>(l.planes.size()) / 2;
  const int64_t dh = l.planes[0].elements, row_bytes = l.planes[0].row_bytes;
  const bool bf16 = l.planes[0].dtype == DType::kBF16;
  for (int64_t p = 0; p < 2 * kv_heads; ++p) {
    const float* src = p < kv_heads ? k + p * dh : v + (p - kv_heads) * dh;
    std::byte* dst = kv.plane_ptr(block, layer, p) + slot * row_bytes;
    if (bf16) {
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < dh; ++i) out[i] = f32_to_bf16(src[i]);
    } else {
      std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(dh));
    }
  }
}

}  // namespace xds

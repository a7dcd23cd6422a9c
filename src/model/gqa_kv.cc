#include "model/gqa_kv.h"

#include <cstring>

#include "base/bf16.h"
#include "base/check.h"
#include "kernels/cpu/int8_quant.h"

namespace xds {
namespace {

// KV heads of a GQA layout: 2 planes a head (float), 4 (int8: the scales' too).
int64_t kv_heads_of(const KvLayout& l) {
  const int64_t per_head = l.planes[0].dtype == DType::kI8 ? 4 : 2;
  return static_cast<int64_t>(l.planes.size()) / per_head;
}

}  // namespace

KvLayout gqa_kv_layout(int64_t layers, int64_t kv_heads, int64_t head_dim, DType dtype) {
  XDS_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kI8,
            "GQA cache dtype {}", dtype_name(dtype));
  KvLayout l;
  l.layers = layers;
  const KvPlane plane{dtype, head_dim, head_dim * dtype_size(dtype)};
  l.planes.assign(static_cast<size_t>(2 * kv_heads), plane);
  if (dtype == DType::kI8) {
    const KvPlane scale{DType::kF32, 1, 4};
    l.planes.insert(l.planes.end(), static_cast<size_t>(2 * kv_heads), scale);
  }
  return l;
}

bool is_gqa_kv_layout(const KvLayout& l) {
  if (l.planes.empty()) return false;
  const KvPlane& p0 = l.planes[0];
  if (p0.dtype != DType::kF32 && p0.dtype != DType::kBF16 && p0.dtype != DType::kI8) return false;
  const int64_t per_head = p0.dtype == DType::kI8 ? 4 : 2;
  if (l.planes.size() % static_cast<size_t>(per_head) != 0) return false;
  const size_t rows = l.planes.size() / static_cast<size_t>(per_head) * 2;
  for (size_t i = 0; i < l.planes.size(); ++i) {
    const KvPlane& p = l.planes[i];
    const bool scale = i >= rows;
    const KvPlane want = scale ? KvPlane{DType::kF32, 1, 4}
                               : KvPlane{p0.dtype, p0.elements, p0.elements * dtype_size(p0.dtype)};
    if (p.dtype != want.dtype || p.elements != want.elements || p.row_bytes != want.row_bytes)
      return false;
  }
  return true;
}

kernels::GqaKvView gqa_kv_view(const KvStorage& kv, int64_t layer, int64_t head,
                               std::span<const int32_t> blocks) {
  const KvLayout& l = kv.layout();
  const int64_t kv_heads = kv_heads_of(l);
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
  if (v.dtype == DType::kI8) {
    v.k_scale_offset = rows.plane_ptr(0, layer, 2 * kv_heads + head) - block0;
    v.v_scale_offset = rows.plane_ptr(0, layer, 3 * kv_heads + head) - block0;
  }
  return v;
}

void gqa_kv_write(KvStorage& kv, int64_t layer, int32_t block, int64_t slot, const float* k,
                  const float* v) {
  const KvLayout& l = kv.layout();
  const int64_t kv_heads = kv_heads_of(l);
  const int64_t dh = l.planes[0].elements, row_bytes = l.planes[0].row_bytes;
  const DType dtype = l.planes[0].dtype;
  for (int64_t p = 0; p < 2 * kv_heads; ++p) {
    const float* src = p < kv_heads ? k + p * dh : v + (p - kv_heads) * dh;
    std::byte* dst = kv.plane_ptr(block, layer, p) + slot * row_bytes;
    if (dtype == DType::kBF16) {
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < dh; ++i) out[i] = f32_to_bf16(src[i]);
    } else if (dtype == DType::kI8) {
      const float scale = kernels::quantize_row_int8(src, dh, reinterpret_cast<int8_t*>(dst));
      std::memcpy(kv.plane_ptr(block, layer, 2 * kv_heads + p) + slot * 4, &scale, 4);
    } else {
      std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(dh));
    }
  }
}

DType gqa_kv_dtype(KvCacheDType kv, ComputeDType compute) {
  if (kv == KvCacheDType::kInt8) return DType::kI8;
  const bool bf16 =
      kv == KvCacheDType::kBF16 || (kv == KvCacheDType::kAuto && compute == ComputeDType::kBF16);
  return bf16 ? DType::kBF16 : DType::kF32;
}

}  // namespace xds

#include "quant/w4_pack.h"

#include <cstring>

#include "base/bf16.h"

namespace xds {
namespace {

OutTensor out_tensor(std::string name, DType dt, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  OutTensor t{std::move(name), dt, std::move(shape), {}};
  t.bytes.resize(static_cast<size_t>(n * dtype_size(dt)));
  return t;
}

void put_i32(OutTensor& t, int64_t i, uint32_t v) { std::memcpy(t.bytes.data() + i * 4, &v, 4); }

void put_scale(OutTensor& t, int64_t i, float v) {
  if (t.dtype == DType::kF32) {
    std::memcpy(t.bytes.data() + i * 4, &v, 4);
    return;
  }
  const uint16_t h = t.dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(t.bytes.data() + i * 2, &h, 2);
}

}  // namespace

W4Linear::W4Linear(int64_t r, int64_t c, int64_t g) : rows(r), cols(c), group(g) {
  q.resize(static_cast<size_t>(rows * cols));
  zero.resize(static_cast<size_t>(rows * groups()));
  scale.resize(zero.size());
}

void append_pack_quantized(const std::string& m, const W4Linear& w, bool symmetric,
                           DType scale_dtype, std::vector<OutTensor>& out) {
  const int64_t rows = w.rows, cols = w.cols, groups = w.groups();
  OutTensor packed = out_tensor(m + ".weight_packed", DType::kI32, {rows, cols / 8});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols / 8; ++i) {
      uint32_t v = 0;
      for (int64_t j = 0; j < 8; ++j) v |= uint32_t{w.q[r * cols + 8 * i + j]} << (4 * j);
      put_i32(packed, r * (cols / 8) + i, v);
    }
  }
  out.push_back(std::move(packed));
  OutTensor scale = out_tensor(m + ".weight_scale", scale_dtype, {rows, groups});
  for (int64_t i = 0; i < rows * groups; ++i) put_scale(scale, i, w.scale[i]);
  out.push_back(std::move(scale));
  OutTensor shape = out_tensor(m + ".weight_shape", DType::kI64, {2});
  const int64_t dims[2] = {rows, cols};
  std::memcpy(shape.bytes.data(), dims, sizeof(dims));
  out.push_back(std::move(shape));
  if (symmetric) return;
  OutTensor zp = out_tensor(m + ".weight_zero_point", DType::kI32, {(rows + 7) / 8, groups});
  for (int64_t i = 0; i < (rows + 7) / 8; ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      uint32_t v = 0;
      for (int64_t j = 0; j < 8 && 8 * i + j < rows; ++j)
        v |= uint32_t{w.zero[(8 * i + j) * groups + g]} << (4 * j);
      put_i32(zp, i * groups + g, v);
    }
  }
  out.push_back(std::move(zp));
}

}  // namespace xds

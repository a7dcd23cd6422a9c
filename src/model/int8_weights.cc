#include "model/int8_weights.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/int8_linear.h"
#include "tensor/dtype.h"

namespace xds {
Result<float> quant_scale_at(const TensorView& s, int64_t i) {
  float v;
  switch (s.dtype) {
    case DType::kF32:
      std::memcpy(&v, s.data + i * 4, 4);
      break;
    case DType::kBF16:
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, s.data + i * 2, 2);
      v = s.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      break;
    }
    default:
      return invalid_argument("{}: tensor '{}': dtype {}, expected BF16, F16 or F32", s.file,
                              s.name, dtype_name(s.dtype));
  }
  if (!std::isfinite(v) || v < 0.0f) {
    return invalid_argument("{}: tensor '{}': element {}: scale {}, expected finite and >= 0",
                            s.file, s.name, i, v);
  }
  return v;
}

namespace {

std::string module_of(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.ends_with(kSuffix)) return weight_name.substr(0, weight_name.size() - 7);
  return weight_name;
}

// The I8 weight [rows, cols] and its scale tensor [rows, 1], checked.
struct Int8Tensors {
  const TensorView* weight = nullptr;
  const TensorView* scale = nullptr;
  std::vector<float> scales;  // [rows] fp32 (exact widening of the stored dtype)
};

Result<Int8Tensors> find_int8(const Checkpoint& ckpt, const std::string& module, int64_t rows,
                              int64_t cols) {
  Int8Tensors t;
  XDS_ASSIGN_OR_RETURN(t.weight, ckpt.require(module + ".weight", {rows, cols}));
  if (t.weight->dtype != DType::kI8) {
    return invalid_argument("{}: tensor '{}': dtype {}, expected I8 (a W8A8 quantized linear)",
                            t.weight->file, t.weight->name, dtype_name(t.weight->dtype));
  }
  if (cols > kernels::kInt8MaxCols) {
    return invalid_argument("{}: tensor '{}': {} columns, above the int8 kernels' exact range {}",
                            t.weight->file, t.weight->name, cols, kernels::kInt8MaxCols);
  }
  XDS_ASSIGN_OR_RETURN(t.scale, ckpt.require(module + ".weight_scale", {rows, 1}));
  const TensorView& s = *t.scale;
  t.scales.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    XDS_ASSIGN_OR_RETURN(t.scales[static_cast<size_t>(r)], quant_scale_at(s, r));
  }
  return t;
}

// A module the config and the tensors agree on: true if quantized (I8), false if float.
Result<bool> agreed(const Checkpoint& ckpt, const IntQuantization& quant,
                    const std::string& weight_name) {
  const std::string module = module_of(weight_name);
  const TensorView* t = ckpt.find(weight_name);
  if (t == nullptr) return false;  // the float binder reports the missing tensor
  const bool quantized = quant.quantizes(module);
  if (quantized && t->dtype != DType::kI8) {
    return invalid_argument(
        "{}: tensor '{}': dtype {}, but field 'quantization_config.ignore' does not list module "
        "'{}', so it must be quantized (I8 with '{}.weight_scale')",
        t->file, t->name, dtype_name(t->dtype), module, module);
  }
  if (!quantized && t->dtype == DType::kI8) {
    return invalid_argument(
        "{}: tensor '{}': dtype I8, but field 'quantization_config.ignore' lists module '{}' "
        "(ignored modules keep their float weights)",
        t->file, t->name, module);
  }
  return quantized;
}

}  // namespace

Result<MatrixRef> bind_int8_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows,
                                   int64_t cols, RepackCache& cache) {
  XDS_ASSIGN_OR_RETURN(Int8Tensors t, find_int8(ckpt, module, rows, cols));
  MatrixRef m{DType::kI8, nullptr, rows, cols, MatrixLayout::kInt8Panels};
  const kernels::Int8PanelsRef shape{nullptr, nullptr, nullptr, rows, cols};
  const int64_t data_bytes = shape.data_bytes(), stored = shape.stored_rows();
  const size_t nbytes = static_cast<size_t>(data_bytes + stored * 8);
  const auto* q = reinterpret_cast<const int8_t*>(t.weight->data);
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(
          repack_key(*t.weight, t.scale, "I8-panel-pairs32-scales-corrections", 0, 0), nbytes,
          [&](std::byte* dst) -> Status {
            const kernels::Int8RowsRef w{q, t.scales.data(), rows, cols, cols};
            const kernels::Int8PanelsOut out{
                reinterpret_cast<int8_t*>(dst), reinterpret_cast<float*>(dst + data_bytes),
                reinterpret_cast<int32_t*>(dst + data_bytes + stored * 4)};
            const int64_t pairs = shape.pairs();
            if (cache.pool() == nullptr || pairs <= 1) {
              kernels::pack_int8_panels(w, 0, pairs, out);
            } else {
              cache.pool()->parallel_for(pairs, [&](int64_t b, int64_t e, int) {
                kernels::pack_int8_panels(w, b, e, out);
              });
            }
            return {};
          }));
  m.data = p;
  m.scales = reinterpret_cast<const float*>(p + data_bytes);
  m.correction = reinterpret_cast<const int32_t*>(p + data_bytes + stored * 4);
  cache.note_bound(ckpt, t.weight->nbytes + t.scale->nbytes);
  return m;
}

Result<MatrixRef> bind_int8_as_f32_rows(const Checkpoint& ckpt, const std::string& module,
                                        int64_t rows, int64_t cols, RepackCache& cache) {
  XDS_ASSIGN_OR_RETURN(Int8Tensors t, find_int8(ckpt, module, rows, cols));
  const auto* q = reinterpret_cast<const int8_t*>(t.weight->data);
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(repack_key(*t.weight, t.scale, "F32-from-I8-channel-scales", 0, 0),
                          static_cast<size_t>(rows * cols * 4), [&](std::byte* dst) -> Status {
                            auto* o = reinterpret_cast<float*>(dst);
                            for (int64_t r = 0; r < rows; ++r) {
                              const float s = t.scales[static_cast<size_t>(r)];
                              for (int64_t c = 0; c < cols; ++c)
                                o[r * cols + c] = static_cast<float>(q[r * cols + c]) * s;
                            }
                            return {};
                          }));
  cache.note_bound(ckpt, t.weight->nbytes + t.scale->nbytes);
  return MatrixRef{DType::kF32, p, rows, cols, MatrixLayout::kRows};
}

Result<AbsorbedHeads> bind_int8_absorbed_heads(const Checkpoint& ckpt, const std::string& module,
                                               int64_t heads, int64_t dn, int64_t dv,
                                               int64_t lat, RepackCache& cache) {
  XDS_ASSIGN_OR_RETURN(Int8Tensors t, find_int8(ckpt, module, heads * (dn + dv), lat));
  const auto* q = reinterpret_cast<const int8_t*>(t.weight->data);
  // Per head: uk_t's panels, scales, corrections, then uv's; each part a multiple of 128
  // bytes, so every head's panels stay 64-byte aligned.
  const kernels::Int8PanelsRef uk_shape{nullptr, nullptr, nullptr, lat, dn};
  const kernels::Int8PanelsRef uv_shape{nullptr, nullptr, nullptr, dv, lat};
  auto part_bytes = [](const kernels::Int8PanelsRef& r) {
    return r.data_bytes() + r.stored_rows() * 8;
  };
  const int64_t uk_bytes = part_bytes(uk_shape), per_head = uk_bytes + part_bytes(uv_shape);
  auto out_at = [](std::byte* p, const kernels::Int8PanelsRef& r) {
    return kernels::Int8PanelsOut{reinterpret_cast<int8_t*>(p),
                                  reinterpret_cast<float*>(p + r.data_bytes()),
                                  reinterpret_cast<int32_t*>(p + r.data_bytes() +
                                                             r.stored_rows() * 4)};
  };
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(
          repack_key(*t.weight, t.scale, "I8-absorbed-heads-panel-pairs32", 0, 0),
          static_cast<size_t>(heads * per_head), [&](std::byte* dst) -> Status {
            const std::vector<float> ones(static_cast<size_t>(lat), 1.0f);
            std::vector<int8_t> uk_t(static_cast<size_t>(lat * dn));  // [C, Dn]
            for (int64_t h = 0; h < heads; ++h) {
              const int8_t* uk = q + h * (dn + dv) * lat;  // [Dn, C]
              for (int64_t i = 0; i < dn; ++i)
                for (int64_t c = 0; c < lat; ++c) uk_t[c * dn + i] = uk[i * lat + c];
              std::byte* head = dst + h * per_head;
              kernels::pack_int8_panels({uk_t.data(), ones.data(), lat, dn, dn}, 0,
                                        uk_shape.pairs(), out_at(head, uk_shape));
              const float* uv_scale = t.scales.data() + h * (dn + dv) + dn;
              kernels::pack_int8_panels({uk + dn * lat, uv_scale, dv, lat, lat}, 0,
                                        uv_shape.pairs(), out_at(head + uk_bytes, uv_shape));
            }
            return {};
          }));
  AbsorbedHeads out;
  auto matrix_at = [&](const std::byte* at, const kernels::Int8PanelsRef& r) {
    MatrixRef m{DType::kI8, at, r.rows, r.cols, MatrixLayout::kInt8Panels};
    m.scales = reinterpret_cast<const float*>(at + r.data_bytes());
    m.correction = reinterpret_cast<const int32_t*>(at + r.data_bytes() + r.stored_rows() * 4);
    return m;
  };
  std::vector<float> uk_scale(static_cast<size_t>(heads * dn));  // [H, Dn]
  for (int64_t h = 0; h < heads; ++h) {
    out.uk_t.push_back(matrix_at(p + h * per_head, uk_shape));
    out.uv.push_back(matrix_at(p + h * per_head + uk_bytes, uv_shape));
    for (int64_t i = 0; i < dn; ++i)
      uk_scale[static_cast<size_t>(h * dn + i)] = t.scales[static_cast<size_t>(h * (dn + dv) + i)];
  }
  out.uk_scale = cache.keep(std::move(uk_scale));
  return out;  // (the tensors' bytes are counted once, by kv_b_proj's bind_int8_linear)
}

Result<bool> w8a8_quantized(const Checkpoint& ckpt, const IntQuantization& quant,
                            const std::string& weight_name) {
  return agreed(ckpt, quant, weight_name);
}

Result<MatrixRef> bind_w8a8_linear(const Checkpoint& ckpt, const IntQuantization& quant,
                                   const std::string& weight_name, int64_t rows, int64_t cols,
                                   RepackCache& cache) {
  XDS_ASSIGN_OR_RETURN(const bool quantized, agreed(ckpt, quant, weight_name));
  if (quantized) return bind_int8_linear(ckpt, module_of(weight_name), rows, cols, cache);
  return bind_linear(ckpt, weight_name, rows, cols, cache);
}

}  // namespace xds

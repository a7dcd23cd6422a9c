#include "model/int4_weights.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "base/bf16.h"
#include "model/int8_weights.h"
#include "tensor/dtype.h"

namespace xds {
namespace {

std::string module_of(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.ends_with(kSuffix)) return weight_name.substr(0, weight_name.size() - 7);
  return weight_name;
}

int32_t load_i32(const TensorView& t, int64_t i) {
  int32_t v;
  std::memcpy(&v, t.data + i * 4, 4);
  return v;
}

// Nibble j (bits 4j..4j+3) of a packed int32.
uint8_t nibble(int32_t word, int64_t j) {
  return static_cast<uint8_t>((static_cast<uint32_t>(word) >> (4 * j)) & 0xfu);
}

Status expect_dtype(const TensorView& t, DType want, const char* what) {
  if (t.dtype == want) return {};
  return invalid_argument("{}: tensor '{}': dtype {}, expected {} ({})", t.file, t.name,
                          dtype_name(t.dtype), dtype_name(want), what);
}

// The groups of g_idx [cols] (module doc): empty when column c is in group c / G for every
// c (the identity), else the checked group of each column. Every group must hold exactly G
// columns, as activation reordering writes them.
Result<std::vector<int32_t>> read_group_index(const TensorView& g_idx, int64_t cols,
                                              int64_t group_cols) {
  XDS_RETURN_IF_ERROR(expect_dtype(g_idx, DType::kI32, "the group of each input column"));
  if (g_idx.shape != std::vector<int64_t>{cols}) {
    return invalid_argument("{}: tensor '{}': shape {}, expected [{}]", g_idx.file, g_idx.name,
                            g_idx.shape_string(), cols);
  }
  const int64_t groups = cols / group_cols;
  std::vector<int32_t> group_of(static_cast<size_t>(cols));
  std::vector<int64_t> count(static_cast<size_t>(groups), 0);
  bool identity = true;
  for (int64_t c = 0; c < cols; ++c) {
    const int32_t g = load_i32(g_idx, c);
    if (g < 0 || g >= groups) {
      return invalid_argument("{}: tensor '{}': column {} is in group {}, expected 0..{}",
                              g_idx.file, g_idx.name, c, g, groups - 1);
    }
    group_of[c] = g;
    ++count[g];
    identity = identity && g == c / group_cols;
  }
  for (int64_t g = 0; g < groups; ++g) {
    if (count[g] != group_cols) {
      return invalid_argument(
          "{}: tensor '{}': group {} holds {} columns, expected group_size {} (every group of "
          "a g_idx holds exactly group_size columns)",
          g_idx.file, g_idx.name, g, count[g], group_cols);
    }
  }
  if (identity) group_of.clear();
  return group_of;
}

Status check_zero_range(const TensorView& t, uint8_t z, int64_t r, int64_t g) {
  if (z <= 15) return {};
  return invalid_argument("{}: tensor '{}': row {} group {}: zero point {}, expected 0..15", t.file,
                          t.name, r, g, z);
}

Result<Int4Unpacked> unpack_pack_quantized(const Checkpoint& ckpt, const IntQuantization& quant,
                                           const std::string& m, int64_t rows, int64_t cols) {
  const int64_t gc = quant.group_size, groups = cols / gc;
  Int4Unpacked u{{}, {}, {}, rows, cols, gc, {}};
  XDS_ASSIGN_OR_RETURN(const TensorView* packed,
                       ckpt.require(m + ".weight_packed", {rows, cols / 8}));
  XDS_RETURN_IF_ERROR(expect_dtype(*packed, DType::kI32, "8 nibbles per int32"));
  XDS_ASSIGN_OR_RETURN(const TensorView* shape, ckpt.require(m + ".weight_shape", {2}));
  if (shape->dtype != DType::kI32 && shape->dtype != DType::kI64) {
    return invalid_argument("{}: tensor '{}': dtype {}, expected I32 or I64", shape->file,
                            shape->name, dtype_name(shape->dtype));
  }
  for (int64_t i = 0; i < 2; ++i) {
    int64_t v;
    if (shape->dtype == DType::kI64) {
      std::memcpy(&v, shape->data + i * 8, 8);
    } else {
      v = load_i32(*shape, i);
    }
    if (v != (i == 0 ? rows : cols)) {
      return invalid_argument(
          "{}: tensor '{}': element {} is {}, expected {} (the weight is [{}, {}])", shape->file,
          shape->name, i, v, i == 0 ? rows : cols, rows, cols);
    }
  }
  XDS_ASSIGN_OR_RETURN(const TensorView* scale, ckpt.require(m + ".weight_scale", {rows, groups}));
  u.q.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols / 8; ++i) {
      const int32_t w = load_i32(*packed, r * (cols / 8) + i);
      for (int64_t j = 0; j < 8; ++j) u.q[r * cols + 8 * i + j] = nibble(w, j);
    }
  }
  u.scale.resize(static_cast<size_t>(rows * groups));
  for (int64_t i = 0; i < rows * groups; ++i) {
    XDS_ASSIGN_OR_RETURN(u.scale[i], quant_scale_at(*scale, i));
  }
  const TensorView* zp = ckpt.find(m + ".weight_zero_point");
  if (zp == nullptr && !quant.symmetric) {
    return invalid_argument(
        "{}: tensor '{}.weight_zero_point' is missing (field "
        "'quantization_config.config_groups.*.weights.symmetric' is false)",
        packed->file, m);
  }
  if (zp != nullptr) {
    XDS_ASSIGN_OR_RETURN(zp, ckpt.require(zp->name, {(rows + 7) / 8, groups}));
    XDS_RETURN_IF_ERROR(expect_dtype(*zp, DType::kI32, "8 zero points per int32, along the rows"));
    u.zero.resize(static_cast<size_t>(rows * groups));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t z = nibble(load_i32(*zp, (r / 8) * groups + g), r % 8);
        if (quant.symmetric && z != 8) {
          return invalid_argument(
              "{}: tensor '{}': row {} group {}: zero point {} (stored {}), but field "
              "'quantization_config.config_groups.*.weights.symmetric' is true (zero point 0)",
              zp->file, zp->name, r, g, int{z} - 8, z);
        }
        u.zero[r * groups + g] = z;
      }
    }
    if (quant.symmetric) u.zero.clear();
  }
  if (const TensorView* g_idx = ckpt.find(m + ".weight_g_idx")) {
    XDS_ASSIGN_OR_RETURN(u.g_idx, read_group_index(*g_idx, cols, gc));
  }
  return u;
}

Result<Int4Unpacked> unpack_gptq(const Checkpoint& ckpt, const IntQuantization& quant,
                                 const std::string& m, int64_t rows, int64_t cols) {
  const int64_t gc = quant.group_size, groups = cols / gc, zcols = (rows + 7) / 8;
  Int4Unpacked u{{}, {}, {}, rows, cols, gc, {}};
  XDS_ASSIGN_OR_RETURN(const TensorView* qw, ckpt.require(m + ".qweight", {cols / 8, rows}));
  XDS_RETURN_IF_ERROR(expect_dtype(*qw, DType::kI32, "8 nibbles per int32, along the inputs"));
  XDS_ASSIGN_OR_RETURN(const TensorView* qz, ckpt.require(m + ".qzeros", {groups, zcols}));
  XDS_RETURN_IF_ERROR(expect_dtype(*qz, DType::kI32, "8 zero points per int32, along the outputs"));
  XDS_ASSIGN_OR_RETURN(const TensorView* sc, ckpt.require(m + ".scales", {groups, rows}));
  u.q.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < cols / 8; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t w = load_i32(*qw, i * rows + r);
      for (int64_t j = 0; j < 8; ++j) u.q[r * cols + 8 * i + j] = nibble(w, j);
    }
  }
  u.scale.resize(static_cast<size_t>(rows * groups));
  u.zero.resize(static_cast<size_t>(rows * groups));
  const int offset = quant.gptq_zero_minus_one ? 1 : 0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      XDS_ASSIGN_OR_RETURN(u.scale[r * groups + g], quant_scale_at(*sc, g * rows + r));
      const uint8_t stored = nibble(load_i32(*qz, g * zcols + r / 8), r % 8);
      const uint8_t z = static_cast<uint8_t>(stored + offset);
      XDS_RETURN_IF_ERROR(check_zero_range(*qz, z, r, g));
      if (quant.symmetric && z != 8) {
        return invalid_argument(
            "{}: tensor '{}': row {} group {}: zero point {} (stored {}), but field "
            "'quantization_config.sym' is true (zero point 8)",
            qz->file, qz->name, r, g, z, stored);
      }
      u.zero[r * groups + g] = z;
    }
  }
  if (quant.symmetric) u.zero.clear();
  if (const TensorView* g_idx = ckpt.find(m + ".g_idx")) {
    XDS_ASSIGN_OR_RETURN(u.g_idx, read_group_index(*g_idx, cols, gc));
  }
  return u;
}

// The tensors a module's repack depends on (the cache key's parts); g_idx where the groups
// are permuted.
std::string int4_key(const Checkpoint& ckpt, const IntQuantization& quant, const std::string& m,
                     std::string_view target, bool permuted) {
  const bool gptq = quant.format == Int4Format::kGptq;
  const TensorView* data = ckpt.find(m + (gptq ? ".qweight" : ".weight_packed"));
  const TensorView* scale = ckpt.find(m + (gptq ? ".scales" : ".weight_scale"));
  std::string key = repack_key(*data, scale, target, quant.group_size, gptq ? 2 : 1);
  const TensorView* zero = ckpt.find(m + (gptq ? ".qzeros" : ".weight_zero_point"));
  if (zero != nullptr) {  // two appends: GCC 12 -O3 warns (-Wrestrict, falsely) on "|" + s
    key += '|';
    key += repack_key(*zero, nullptr, "zero", 0, 0);
  }
  if (permuted) {
    key += '|';
    key += repack_key(*ckpt.find(m + (gptq ? ".g_idx" : ".weight_g_idx")), nullptr, "groups", 0, 0);
  }
  return key;
}

}  // namespace

float Int4Unpacked::weight(int64_t r, int64_t c) const {
  const int64_t group = g_idx.empty() ? c / group_cols : g_idx[static_cast<size_t>(c)];
  const int64_t g = r * (cols / group_cols) + group;
  const int z = zero.empty() ? 8 : zero[static_cast<size_t>(g)];
  return scale[static_cast<size_t>(g)] * static_cast<float>(int{q[r * cols + c]} - z);
}

std::vector<int32_t> sort_int4_columns_by_group(Int4Unpacked& u) {
  if (u.g_idx.empty()) return {};
  const int64_t groups = u.cols / u.group_cols;
  // Counting sort by group, stable: group g's columns in ascending order at [g·G, (g+1)·G).
  std::vector<int64_t> next(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) next[g] = g * u.group_cols;
  std::vector<int32_t> order(static_cast<size_t>(u.cols));
  for (int64_t c = 0; c < u.cols; ++c) order[next[u.g_idx[c]]++] = static_cast<int32_t>(c);
  std::vector<uint8_t> row(static_cast<size_t>(u.cols));
  for (int64_t r = 0; r < u.rows; ++r) {
    uint8_t* q = u.q.data() + r * u.cols;
    for (int64_t j = 0; j < u.cols; ++j) row[j] = q[order[j]];
    std::memcpy(q, row.data(), row.size());
  }
  u.g_idx.clear();
  return order;
}

Result<Int4Unpacked> unpack_int4_module(const Checkpoint& ckpt, const IntQuantization& quant,
                                        const std::string& module, int64_t rows, int64_t cols) {
  if (!kernels::int4_group_cols_supported(quant.group_size) || cols % quant.group_size != 0) {
    return invalid_argument(
        "{}.weight: {} input columns, not a multiple of field "
        "'quantization_config...group_size' {}",
        module, cols, quant.group_size);
  }
  if (quant.format == Int4Format::kGptq) return unpack_gptq(ckpt, quant, module, rows, cols);
  if (quant.format == Int4Format::kPackQuantized) {
    return unpack_pack_quantized(ckpt, quant, module, rows, cols);
  }
  return invalid_argument("{}: not a 4-bit quantization config", module);
}

Result<MatrixRef> bind_int4_linear(const Checkpoint& ckpt, const IntQuantization& quant,
                                   const std::string& module, int64_t rows, int64_t cols,
                                   RepackCache& cache) {
  XDS_ASSIGN_OR_RETURN(Int4Unpacked u, unpack_int4_module(ckpt, quant, module, rows, cols));
  // Permuted groups: the panels take the columns sorted by group (order [cols], stored after
  // the zero points), and the product gathers x through it.
  const std::vector<int32_t> order = sort_int4_columns_by_group(u);
  const bool permuted = !order.empty();
  const kernels::Int4Source src = u.source();
  XDS_RETURN_IF_ERROR(kernels::check_int4_source(src));
  const bool asym = !u.zero.empty();
  const kernels::Int4PanelsRef shape{nullptr, nullptr, nullptr, rows, cols, u.group_cols};
  const int64_t data_bytes = shape.data_bytes(), count = shape.scale_count();
  const int64_t order_offset = data_bytes + count * 4 + (asym ? count : 0);  // a multiple of 4
  const size_t nbytes = static_cast<size_t>(order_offset + (permuted ? cols * 4 : 0));
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(
          int4_key(ckpt, quant, module,
                   permuted ? "I4-pairs32-quads-group-scales-zeros-order"
                            : "I4-pairs32-quads-group-scales-zeros",
                   permuted),
          nbytes, [&](std::byte* dst) -> Status {
            if (permuted) std::memcpy(dst + order_offset, order.data(), order.size() * 4);
            const kernels::Int4PanelsOut out{
                reinterpret_cast<uint8_t*>(dst), reinterpret_cast<float*>(dst + data_bytes),
                asym ? reinterpret_cast<uint8_t*>(dst + data_bytes + count * 4) : nullptr};
            const int64_t pairs = shape.pairs();
            if (cache.pool() == nullptr || pairs <= 1) {
              kernels::pack_int4_panels(src, 0, pairs, out);
            } else {
              cache.pool()->parallel_for(pairs, [&](int64_t b, int64_t e, int) {
                kernels::pack_int4_panels(src, b, e, out);
              });
            }
            return {};
          }));
  MatrixRef m{DType::kU8, p, rows, cols, MatrixLayout::kInt4Panels};
  m.scales = reinterpret_cast<const float*>(p + data_bytes);
  m.zero = asym ? reinterpret_cast<const uint8_t*>(p + data_bytes + count * 4) : nullptr;
  m.group_cols = u.group_cols;
  m.int8_activations = quant.scheme == IntScheme::kW4A8;
  // The order rides in `correction` (kernels/cpu/int4_matrix.h: int4_column_order).
  if (permuted) m.correction = reinterpret_cast<const int32_t*>(p + order_offset);
  cache.note_bound(ckpt, static_cast<size_t>(rows * cols / 2 + rows * (cols / u.group_cols) * 2));
  return m;
}

Result<MatrixRef> bind_int4_as_f32_rows(const Checkpoint& ckpt, const IntQuantization& quant,
                                        const std::string& module, int64_t rows, int64_t cols,
                                        RepackCache& cache) {
  XDS_ASSIGN_OR_RETURN(const Int4Unpacked u, unpack_int4_module(ckpt, quant, module, rows, cols));
  XDS_RETURN_IF_ERROR(kernels::check_int4_source(u.source()));
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(
          int4_key(ckpt, quant, module, "F32-from-I4-group-scales", !u.g_idx.empty()),
          static_cast<size_t>(rows * cols * 4), [&](std::byte* dst) -> Status {
            auto* o = reinterpret_cast<float*>(dst);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = u.weight(r, c);
            return {};
          }));
  cache.note_bound(ckpt, static_cast<size_t>(rows * cols / 2));
  return MatrixRef{DType::kF32, p, rows, cols, MatrixLayout::kRows};
}

Result<bool> int4_quantized(const Checkpoint& ckpt, const IntQuantization& quant,
                            const std::string& weight_name) {
  const std::string m = module_of(weight_name);
  const TensorView* plain = ckpt.find(weight_name);
  if (quant.format == Int4Format::kGptq) {
    const TensorView* qw = ckpt.find(m + ".qweight");
    if (qw != nullptr && plain != nullptr) {
      return invalid_argument(
          "{}: tensors '{}.qweight' and '{}' both present (GPTQ: one or the other)", qw->file, m,
          weight_name);
    }
    return qw != nullptr;
  }
  const TensorView* packed = ckpt.find(m + ".weight_packed");
  const bool quantized = quant.quantizes(m);
  if (quantized && packed == nullptr) {
    if (plain == nullptr) {
      return invalid_argument(
          "tensor '{}.weight_packed' is missing (field "
          "'quantization_config.ignore' does not list module '{}')",
          m, m);
    }
    return invalid_argument(
        "{}: tensor '{}': dtype {}, but field 'quantization_config.ignore' does not list module "
        "'{}', so it must be quantized ('{}.weight_packed', '{}.weight_scale')",
        plain->file, plain->name, dtype_name(plain->dtype), m, m, m);
  }
  if (!quantized && packed != nullptr) {
    return invalid_argument(
        "{}: tensor '{}': present, but field 'quantization_config.ignore' lists module '{}' "
        "(ignored modules keep their float weights)",
        packed->file, packed->name, m);
  }
  return quantized;
}

// The scheme of weight_name's module: W8A8 for every module of a W8A8 checkpoint and for the
// int8 group's modules of a mixed-precision 4-bit one (quant_config.h layout 2b).
bool int8_scheme(const IntQuantization& quant, const std::string& weight_name) {
  return quant.scheme_of(module_of(weight_name)) == IntScheme::kW8A8;
}

Result<bool> int_quantized(const Checkpoint& ckpt, const IntQuantization& quant,
                           const std::string& weight_name) {
  if (int8_scheme(quant, weight_name)) return w8a8_quantized(ckpt, quant, weight_name);
  return int4_quantized(ckpt, quant, weight_name);
}

Result<MatrixRef> bind_int_linear(const Checkpoint& ckpt, const IntQuantization& quant,
                                  const std::string& weight_name, int64_t rows, int64_t cols,
                                  RepackCache& cache) {
  if (int8_scheme(quant, weight_name)) {
    return bind_w8a8_linear(ckpt, quant, weight_name, rows, cols, cache);
  }
  XDS_ASSIGN_OR_RETURN(const bool quantized, int4_quantized(ckpt, quant, weight_name));
  if (quantized) return bind_int4_linear(ckpt, quant, module_of(weight_name), rows, cols, cache);
  return bind_linear(ckpt, weight_name, rows, cols, cache);
}

Result<MatrixRef> bind_int_as_f32_rows(const Checkpoint& ckpt, const IntQuantization& quant,
                                       const std::string& weight_name, int64_t rows, int64_t cols,
                                       RepackCache& cache) {
  const std::string m = module_of(weight_name);
  if (int8_scheme(quant, weight_name)) return bind_int8_as_f32_rows(ckpt, m, rows, cols, cache);
  return bind_int4_as_f32_rows(ckpt, quant, m, rows, cols, cache);
}

}  // namespace xds

#include "mkmodel/int4_checkpoint.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "base/bf16.h"
#include "base/hash.h"
#include "base/read_file.h"
#include "base/thread_pool.h"
#include "model/deepseek_v3/config.h"
#include "model/quant_config.h"
#include "model/safetensors.h"
#include "quant/checkpoint_writer.h"
#include "quant/w4_pack.h"
#include "quant/w4_rtn.h"
#include "quant/w8a8_rtn.h"

namespace xds {
namespace {

using ojson = nlohmann::ordered_json;

Status write_text(const std::string& path, const std::string& text) {
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(text));
  return f.commit();
}

bool int4_target(const std::string& name) {
  return w8a8_rtn_target(name) ||
         (name.starts_with("model.layers.") && name.ends_with(".self_attn.kv_b_proj.weight"));
}

float element(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kF32) {
    float v;
    std::memcpy(&v, t.data + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, t.data + i * 2, 2);
  return t.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

OutTensor out_tensor(std::string name, DType dt, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  OutTensor t{std::move(name), dt, std::move(shape), {}};
  t.bytes.resize(static_cast<size_t>(n * dtype_size(dt)));
  return t;
}

void put_i32(OutTensor& t, int64_t i, uint32_t v) {
  std::memcpy(t.bytes.data() + i * 4, &v, 4);
}

void put_scale(OutTensor& t, int64_t i, float v) {
  if (t.dtype == DType::kF32) {
    std::memcpy(t.bytes.data() + i * 4, &v, 4);
    return;
  }
  const uint16_t h = t.dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(t.bytes.data() + i * 2, &h, 2);
}

// --int4-actorder group: the activation order of module `name`'s cols input columns, a
// Fisher-Yates shuffle drawn from mt19937_64(seed ^ fnv1a64(name)). Position j of the order
// holds column order[j]; its group is j / G (g_idx[order[j]] = j / G).
std::vector<int32_t> seeded_column_order(int64_t cols, uint64_t seed, const std::string& name) {
  std::vector<int32_t> order(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) order[c] = static_cast<int32_t>(c);
  std::mt19937_64 rng(seed ^ fnv1a64(name));
  for (int64_t i = cols - 1; i > 0; --i) std::swap(order[i], order[rng() % (i + 1)]);
  return order;
}

// Rounds t per group (quant/w4_rtn.h). order empty: group g is columns [g·G, (g+1)·G); else
// group g is columns order[g·G .. (g+1)·G) (out.q stays in the checkpoint's column order).
Result<W4Linear> quantize(const TensorView& t, int64_t group, bool symmetric, DType scale_dtype,
                          const std::vector<int32_t>& order, ThreadPool& pool) {
  const int64_t rows = t.shape[0], cols = t.shape[1], groups = cols / group;
  W4Linear out(rows, cols, group);
  std::atomic<int64_t> bad{-1};
  pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
    std::vector<float> w(static_cast<size_t>(cols));  // [cols] in group order
    std::vector<uint8_t> q(static_cast<size_t>(cols));
    for (int64_t r = b; r < e; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t c = order.empty() ? j : order[j];
        w[j] = element(t, r * cols + c);
        if (!std::isfinite(w[j])) bad.store(r * cols + c);
      }
      w4_rtn_quantize_row(w.data(), cols, group, symmetric, scale_dtype,
                          {q.data(), out.scale.data() + r * groups, out.zero.data() + r * groups});
      for (int64_t j = 0; j < cols; ++j) out.q[r * cols + (order.empty() ? j : order[j])] = q[j];
    }
  });
  if (bad.load() >= 0) {
    return invalid_argument("{}: tensor '{}': element {} is not finite", t.file, t.name,
                            bad.load());
  }
  return out;
}

// g_idx [cols] I32 named `name`: column c in group c / G, or (order set) g_idx[order[j]] = j / G.
OutTensor group_index_tensor(const std::string& name, int64_t cols, int64_t group,
                             const std::vector<int32_t>& order) {
  OutTensor g_idx = out_tensor(name, DType::kI32, {cols});
  for (int64_t j = 0; j < cols; ++j)
    put_i32(g_idx, order.empty() ? j : order[j], static_cast<uint32_t>(j / group));
  return g_idx;
}

// GPTQ v1 tensors of module m (zero points stored minus 1; g_idx from order as above).
Status add_gptq(const std::string& m, const TensorView& t, const W4Linear& qz, int64_t group,
                const std::vector<int32_t>& order, std::vector<OutTensor>& out) {
  const int64_t rows = t.shape[0], cols = t.shape[1], groups = cols / group;
  OutTensor qweight = out_tensor(m + ".qweight", DType::kI32, {cols / 8, rows});
  for (int64_t i = 0; i < cols / 8; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      uint32_t v = 0;
      for (int64_t j = 0; j < 8; ++j) v |= uint32_t{qz.q[r * cols + 8 * i + j]} << (4 * j);
      put_i32(qweight, i * rows + r, v);
    }
  }
  out.push_back(std::move(qweight));
  const int64_t zcols = (rows + 7) / 8;
  OutTensor qzeros = out_tensor(m + ".qzeros", DType::kI32, {groups, zcols});
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < zcols; ++i) {
      uint32_t v = 0;
      for (int64_t j = 0; j < 8 && 8 * i + j < rows; ++j) {
        const uint8_t z = qz.zero[(8 * i + j) * groups + g];
        if (z == 0) {
          return invalid_argument(
              "{}: row {} group {}: zero point 0, which GPTQ v1 (stored "
              "minus 1) cannot hold",
              m, 8 * i + j, g);
        }
        v |= uint32_t{static_cast<uint8_t>(z - 1)} << (4 * j);
      }
      put_i32(qzeros, g * zcols + i, v);
    }
  }
  out.push_back(std::move(qzeros));
  OutTensor scales = out_tensor(m + ".scales", DType::kF16, {groups, rows});
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < rows; ++r) put_scale(scales, g * rows + r, qz.scale[r * groups + g]);
  out.push_back(std::move(scales));
  out.push_back(group_index_tensor(m + ".g_idx", cols, group, order));
  return {};
}

// --int8-head-and-kv-b: weight `name` [rows, cols] as W8A8 by RTN per output row
// (quant/w8a8_rtn.h): `name` I8 and `name`_scale [rows, 1] in the weight's float dtype.
void append_int8_rtn(const std::string& name, const TensorView& t, std::vector<OutTensor>& out) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  OutTensor q = out_tensor(name, DType::kI8, {rows, cols});
  OutTensor s = out_tensor(name + "_scale", t.dtype, {rows, 1});
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) row[static_cast<size_t>(c)] = element(t, r * cols + c);
    const float scale = rtn_quantize_row(row.data(), cols, t.dtype,
                                         reinterpret_cast<int8_t*>(q.bytes.data()) + r * cols);
    put_scale(s, r, scale);
  }
  out.push_back(std::move(q));
  out.push_back(std::move(s));
}

Status check_options(const MkModelOptions& o) {
  if (o.weights_int4 != "sym" && o.weights_int4 != "asym") {
    return invalid_argument("mkmodel: --weights-int4 must be sym or asym, got '{}'",
                            o.weights_int4);
  }
  if (o.int4_group_size != 32 && o.int4_group_size != 64 && o.int4_group_size != 128) {
    return invalid_argument("mkmodel: --group-size must be 32, 64 or 128, got {}",
                            o.int4_group_size);
  }
  if (o.int4_format != "pack-quantized" && o.int4_format != "gptq") {
    return invalid_argument("mkmodel: --int4-format must be pack-quantized or gptq, got '{}'",
                            o.int4_format);
  }
  if (o.int4_format == "gptq" && o.int4_int8_activations) {
    return invalid_argument("mkmodel: --int4-format gptq is W4A16 only (no int8 activations)");
  }
  if (o.int4_actorder != "none" && o.int4_actorder != "group") {
    return invalid_argument("mkmodel: --int4-actorder must be none or group, got '{}'",
                            o.int4_actorder);
  }
  if (o.weights_int8) return invalid_argument("mkmodel: --weights-int4 with --weights-int8");
  if (o.int8_head_and_kv_b && o.int4_format == "gptq") {
    return invalid_argument(
        "mkmodel: --int8-head-and-kv-b with --int4-format gptq (a GPTQ config has no second "
        "group; use pack-quantized)");
  }
  return {};
}

Status write_copy(const MkModelOptions& o, const std::string& from) {
  XDS_ASSIGN_OR_RETURN(const DeepseekV3Config src_c, load_deepseek_v3_config(from));
  if (src_c.fp8 || src_c.int_quant) {
    return invalid_argument(
        "{}/config.json: field 'quantization_config': expected none (a float "
        "model)",
        from);
  }
  XDS_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(from));
  const bool gptq = o.int4_format == "gptq", symmetric = o.weights_int4 == "sym";
  const bool actorder = o.int4_actorder == "group";
  const int64_t group = o.int4_group_size;
  ThreadPool pool(o.threads > 0 ? o.threads : 2);
  std::vector<OutTensor> out;
  std::vector<std::string> ignore;
  for (const std::string& name : ckpt.names()) {
    const TensorView* t = ckpt.find(name);
    if (o.int8_head_and_kv_b && w8a8_head_or_kv_b(name)) {
      append_int8_rtn(name, *t, out);
      continue;
    }
    const bool fits = t->shape.size() == 2 && t->shape[1] % group == 0;
    if (!int4_target(name) || !fits) {
      if (int4_target(name)) ignore.push_back(name.substr(0, name.size() - 7));
      OutTensor copy{name, t->dtype, t->shape, {}};
      copy.bytes.assign(t->data, t->data + t->nbytes);
      out.push_back(std::move(copy));
      continue;
    }
    const std::string m = name.substr(0, name.size() - 7);
    const std::vector<int32_t> order =
        actorder ? seeded_column_order(t->shape[1], o.seed, m) : std::vector<int32_t>{};
    XDS_ASSIGN_OR_RETURN(const W4Linear qz, quantize(*t, group, symmetric,
                                                     gptq ? DType::kF16 : t->dtype, order, pool));
    if (gptq) {
      XDS_RETURN_IF_ERROR(add_gptq(m, *t, qz, group, order, out));
    } else {
      // W4Linear's q in checkpoint order, its scales and zero points per group: the packing
      // is the same, the groups are what weight_g_idx says.
      append_pack_quantized(m, qz, symmetric, t->dtype, out);
      if (actorder)
        out.push_back(group_index_tensor(m + ".weight_g_idx", t->shape[1], group, order));
    }
  }
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(from + "/config.json"));
  ojson config = ojson::parse(text);
  if (gptq) {
    config["quantization_config"] = w4_gptq_json(group, symmetric);
    if (actorder) config["quantization_config"]["desc_act"] = true;
  } else {
    std::vector<std::string> ignore_all = {"re:.*mlp\\.gate$", "re:.*eh_proj$"};
    if (!o.int8_head_and_kv_b) {
      ignore_all.insert(ignore_all.begin(), "lm_head");
      ignore_all.push_back("re:.*shared_head\\.head$");
    }
    ignore_all.insert(ignore_all.end(), ignore.begin(), ignore.end());
    config["quantization_config"] =
        o.int8_head_and_kv_b
            ? w4_int8_head_quantization_json(group, symmetric, o.int4_int8_activations, ignore_all)
            : w4_pack_quantized_json(group, symmetric, o.int4_int8_activations, ignore_all);
    if (actorder) {
      config["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] = "group";
    }
  }
  const std::string config_text = config.dump(2) + "\n";
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return internal_error("{}: cannot create the directory: {}", o.out_dir, ec.message());
  XDS_RETURN_IF_ERROR(parse_deepseek_v3_config(config_text, o.out_dir + "/config.json").status());
  XDS_RETURN_IF_ERROR(copy_checkpoint_side_files(from, o.out_dir));
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/config.json", config_text));
  int64_t total = 0;
  for (const OutTensor& t : out) total += static_cast<int64_t>(t.bytes.size());
  const int64_t max_shard = o.shards <= 1 ? total + 1 : total / o.shards + 1;
  return write_sharded_safetensors(o.out_dir, out, max_shard);
}

}  // namespace

Status write_int4_checkpoint(const MkModelOptions& o) {
  XDS_RETURN_IF_ERROR(check_options(o));
  if (!o.from_dir.empty()) return write_copy(o, o.from_dir);
  MkModelOptions flt = o;
  flt.weights_int4.clear();
  flt.int8_head_and_kv_b = false;
  flt.out_dir = o.out_dir + ".float-" + std::to_string(::getpid());
  XDS_RETURN_IF_ERROR(write_random_checkpoint(flt));
  const Status s = write_copy(o, flt.out_dir);
  std::error_code ec;
  std::filesystem::remove_all(flt.out_dir, ec);
  return s;
}

}  // namespace xds

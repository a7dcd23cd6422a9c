#include "mkmodel/mkmodel.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "base/bf16.h"
#include "base/hash.h"
#include "base/read_file.h"
#include "base/thread_pool.h"
#include "mkmodel/glm4_checkpoint.h"
#include "mkmodel/int4_checkpoint.h"
#include "mkmodel/mkmodel_config.h"
#include "mkmodel/qwen3_checkpoint.h"
#include "mkmodel/router_skew.h"
#include "model/moe_routing.h"
#include "model/quant_config.h"
#include "model/safetensors.h"
#include "quant/checkpoint_writer.h"
#include "quant/w8a8_rtn.h"
#include "tensor/dtype.h"

namespace xds {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int64_t kBlock = 128;                // FP8 block size (published layout)
constexpr size_t kProgressBytes = 1ull << 30;  // progress line above ~1 GB
constexpr size_t kChunkBytes = 8u << 20;       // generate at most ~8 MB per step

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from the element counter.
inline float uniform(uint64_t key, uint64_t i) {
  const uint64_t x = splitmix64(key + i * 0xd1342543de82ef95ull);
  return static_cast<float>(static_cast<int64_t>(x >> 40) - (1ll << 23)) * (1.0f / (1 << 23));
}

enum class Init { kLinear, kEmbed, kNorm, kRouter, kBias };
static_assert(static_cast<int>(Init::kRouter) == static_cast<int>(RandomInit::kRouter));
static_assert(static_cast<int>(Init::kBias) == static_cast<int>(RandomInit::kBias));

// One tensor to write. A FP8 weight is followed by its `_scale_inv`, an I8 one by its
// `_scale` (is_scale).
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  Init init = Init::kLinear;
  bool is_scale = false;
  std::vector<float> values;  // [numel] F32 written as they are (a fitted bias); empty: generated
  const TensorView* src = nullptr;   // --from: the values are this tensor's (not generated)
  DType float_dtype = DType::kBF16;  // I8 weights: the float model's dtype (and the scale's)

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

// The value of element (r, c) of a tensor, before rounding to its dtype.
struct Gen {
  uint64_t key;
  float scale;  // uniform amplitude
  float offset;
  const TensorView* src = nullptr;  // BF16, F16 or F32: element i read from it instead
  float at(int64_t i) const {
    if (src != nullptr) return source_value(i);
    return offset + scale * uniform(key, static_cast<uint64_t>(i));
  }
  float source_value(int64_t i) const {
    if (src->dtype == DType::kF32) return reinterpret_cast<const float*>(src->data)[i];
    const uint16_t h = reinterpret_cast<const uint16_t*>(src->data)[i];
    return src->dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
};

Gen make_gen(const Spec& s, uint64_t seed) {
  if (s.src != nullptr) return {0, 0.0f, 0.0f, s.src};
  const uint64_t key = splitmix64(seed ^ fnv1a64(s.name));
  const int64_t fan_in = s.shape.size() == 2 ? s.shape[1] : 1;
  const float sqrt3 = std::sqrt(3.0f);  // U(-a, a) has std a / sqrt(3)
  switch (s.init) {
    case Init::kLinear:
      return {key, sqrt3 / std::sqrt(static_cast<float>(fan_in)), 0.0f};
    case Init::kEmbed:
      return {key, 1.0f, 0.0f};
    case Init::kNorm:
      return {key, 0.1f, 1.0f};
    case Init::kRouter:
      return {key, 2.0f * sqrt3 / std::sqrt(static_cast<float>(fan_in)), 0.0f};
    case Init::kBias:
      return {key, 0.05f, 0.0f};
  }
  return {key, 0.0f, 0.0f};
}

// ---- the tensor list of a config ----

struct Builder {
  const DeepseekV3Config& c;
  bool fp8;
  DType plain;  // BF16 or F16: every tensor not FP8 or F32
  bool int8;    // W8A8 (w8a8_rtn.h)
  bool int8_head;  // with int8: lm_head, shared_head.head and kv_b_proj quantized too
  std::vector<Spec> specs;

  void add(std::string name, std::vector<int64_t> shape, Init init,
           std::optional<DType> dt = std::nullopt) {
    specs.push_back({std::move(name), std::move(shape), dt.value_or(plain), init, false, {}});
  }
  // I8 [rows, cols] and `<name>_scale` [rows, 1] in the float model's dtype (w8a8_rtn.h).
  void int8_proj(const std::string& name, int64_t rows, int64_t cols) {
    add(name, {rows, cols}, Init::kLinear, DType::kI8);
    specs.back().float_dtype = plain;
    specs.push_back({name + "_scale", {rows, 1}, plain, Init::kLinear, true, {}});
  }
  // An attention / MLP projection: FP8 + scales in fp8 mode.
  void proj(const std::string& name, int64_t rows, int64_t cols) {
    if (int8 && w8a8_rtn_target(name, int8_head)) return int8_proj(name, rows, cols);
    if (!fp8) {
      add(name, {rows, cols}, Init::kLinear);
      return;
    }
    add(name, {rows, cols}, Init::kLinear, DType::kF8E4M3);
    specs.push_back({name + "_scale_inv",
                     {(rows + kBlock - 1) / kBlock, (cols + kBlock - 1) / kBlock},
                     DType::kF32,
                     Init::kLinear,
                     true,
                     {}});
  }
  // lm_head or an MTP layer's shared_head.head: [vocab, D].
  void head(const std::string& name) {
    if (int8 && int8_head) return int8_proj(name, c.vocab_size, c.hidden_size);
    add(name, {c.vocab_size, c.hidden_size}, Init::kLinear);
  }
  void mlp(const std::string& p, int64_t width) {
    const int64_t d = c.hidden_size;
    proj(p + ".gate_proj.weight", width, d);
    proj(p + ".up_proj.weight", width, d);
    proj(p + ".down_proj.weight", d, width);
  }
  void decoder_layer(int64_t i) {
    const std::string p = "model.layers." + std::to_string(i);
    const int64_t d = c.hidden_size, h = c.num_attention_heads;
    add(p + ".input_layernorm.weight", {d}, Init::kNorm);
    const std::string a = p + ".self_attn";
    if (c.q_lora_rank) {
      proj(a + ".q_a_proj.weight", *c.q_lora_rank, d);
      add(a + ".q_a_layernorm.weight", {*c.q_lora_rank}, Init::kNorm);
      proj(a + ".q_b_proj.weight", h * c.qk_head_dim(), *c.q_lora_rank);
    } else {
      proj(a + ".q_proj.weight", h * c.qk_head_dim(), d);
    }
    proj(a + ".kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, d);
    add(a + ".kv_a_layernorm.weight", {c.kv_lora_rank}, Init::kNorm);
    proj(a + ".kv_b_proj.weight", h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
    proj(a + ".o_proj.weight", d, h * c.v_head_dim);
    add(p + ".post_attention_layernorm.weight", {d}, Init::kNorm);
    if (!c.is_moe_layer(i)) {
      mlp(p + ".mlp", c.intermediate_size);
      return;
    }
    add(p + ".mlp.gate.weight", {c.n_routed_experts, d}, Init::kRouter);
    if (c.topk_method == TopkMethod::kNoauxTc) {  // DeepSeek-V2's gate has no bias
      add(p + ".mlp.gate.e_score_correction_bias", {c.n_routed_experts}, Init::kBias, DType::kF32);
    }
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      mlp(p + ".mlp.experts." + std::to_string(e), c.moe_intermediate_size);
    }
    if (c.n_shared_experts > 0) {
      mlp(p + ".mlp.shared_experts", c.n_shared_experts * c.moe_intermediate_size);
    }
  }
};

std::vector<Spec> tensor_specs(const DeepseekV3Config& c, bool fp8, DType plain, bool int8,
                               bool int8_head) {
  Builder b{c, fp8, plain, int8, int8_head, {}};
  const int64_t d = c.hidden_size, v = c.vocab_size;
  b.add("model.embed_tokens.weight", {v, d}, Init::kEmbed);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) b.decoder_layer(i);
  for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    const int64_t l = c.num_hidden_layers + k;
    const std::string p = "model.layers." + std::to_string(l);
    b.add(p + ".embed_tokens.weight", {v, d}, Init::kEmbed);
    b.add(p + ".enorm.weight", {d}, Init::kNorm);
    b.add(p + ".hnorm.weight", {d}, Init::kNorm);
    b.add(p + ".eh_proj.weight", {d, 2 * d}, Init::kLinear);
    b.decoder_layer(l);
    b.add(p + ".shared_head.norm.weight", {d}, Init::kNorm);
    b.head(p + ".shared_head.head.weight");
  }
  b.add("model.norm.weight", {d}, Init::kNorm);
  b.head("lm_head.weight");
  return std::move(b.specs);
}

Status write_text(const std::string& path, const std::string& text) {
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(text));
  return f.commit();
}

// ---- writing tensors ----

// Progress across all files (only shown for outputs > ~1 GB).
struct Progress {
  size_t total = 0, done = 0;
  bool enabled = false;
  double last = -1;
  void add(size_t n) {
    done += n;
    if (!enabled) return;
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (t - last < 0.25 && done < total) return;
    last = t;
    std::fprintf(stderr, "\rmkmodel: %.2f/%.2f GB", done / 1e9, total / 1e9);
    std::fflush(stderr);
  }
};

Status pwrite_all(int fd, const std::string& path, const void* buf, size_t n, size_t off) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return internal_error("{}: write of {} bytes at {} failed: {}", path, n, off,
                            std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<size_t>(w);
  }
  return {};
}

struct TensorWriter {
  ThreadPool& pool;
  uint64_t seed;
  Progress& progress;
  std::vector<float> last_scales;  // scales of the last FP8 weight, [ceil(r/128)*ceil(c/128)],
                                   // or of the last I8 weight, [rows]
  std::vector<std::byte> buf;

  // Writes tensor `s` at file offset `off`.
  Status write(int fd, const std::string& path, const Spec& s, size_t off) {
    if (s.is_scale) {
      XDS_CHECK(last_scales.size() == static_cast<size_t>(s.numel()), "scales out of order: {}",
                s.name);
      if (s.dtype != DType::kF32) {  // I8 weights' scales: exact in their dtype
        std::vector<uint16_t> h(last_scales.size());
        for (size_t i = 0; i < h.size(); ++i)
          h[i] = s.dtype == DType::kBF16 ? f32_to_bf16(last_scales[i]) : f32_to_f16(last_scales[i]);
        XDS_RETURN_IF_ERROR(pwrite_all(fd, path, h.data(), s.nbytes(), off));
        progress.add(s.nbytes());
        return {};
      }
      XDS_RETURN_IF_ERROR(pwrite_all(fd, path, last_scales.data(), s.nbytes(), off));
      progress.add(s.nbytes());
      return {};
    }
    if (!s.values.empty()) {
      XDS_CHECK(s.dtype == DType::kF32 && s.values.size() == static_cast<size_t>(s.numel()),
                "fixed values of {}: {} for {} elements", s.name, s.values.size(), s.numel());
      XDS_RETURN_IF_ERROR(pwrite_all(fd, path, s.values.data(), s.nbytes(), off));
      progress.add(s.nbytes());
      return {};
    }
    const Gen g = make_gen(s, seed);
    const int64_t rows = s.shape.size() == 2 ? s.shape[0] : 1;
    const int64_t cols = s.shape.empty() ? 1 : s.shape.back();
    const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(s.dtype);
    // Rows per chunk: a multiple of the FP8 block, ~kChunkBytes.
    int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / row_bytes));
    if (s.dtype == DType::kF8E4M3) {
      chunk = std::max<int64_t>(kBlock, chunk / kBlock * kBlock);
      const int64_t sc = (cols + kBlock - 1) / kBlock;
      last_scales.assign(static_cast<size_t>(((rows + kBlock - 1) / kBlock) * sc), 0.0f);
    }
    if (s.dtype == DType::kI8) last_scales.assign(static_cast<size_t>(rows), 0.0f);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t r1 = std::min(rows, r0 + chunk);
      buf.resize(static_cast<size_t>(r1 - r0) * row_bytes);
      if (s.dtype == DType::kF8E4M3) {
        fill_fp8(g, rows, cols, r0, r1);
      } else if (s.dtype == DType::kI8) {
        fill_int8(g, s.float_dtype, cols, r0, r1);
      } else {
        fill_plain(g, s.dtype, cols, r0, r1);
      }
      XDS_RETURN_IF_ERROR(
          pwrite_all(fd, path, buf.data(), buf.size(), off + static_cast<size_t>(r0) * row_bytes));
      progress.add(buf.size());
    }
    return {};
  }

  void fill_plain(const Gen& g, DType dt, int64_t cols, int64_t r0, int64_t r1) {
    const int64_t n = (r1 - r0) * cols, base = r0 * cols;
    std::byte* out = buf.data();
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
      if (dt == DType::kF32) {
        auto* o = reinterpret_cast<float*>(out);
        for (int64_t i = b; i < e; ++i) o[i] = g.at(base + i);
      } else if (dt == DType::kF16) {
        auto* o = reinterpret_cast<uint16_t*>(out);
        for (int64_t i = b; i < e; ++i) o[i] = f32_to_f16(g.at(base + i));
      } else {
        auto* o = reinterpret_cast<uint16_t*>(out);
        for (int64_t i = b; i < e; ++i) o[i] = f32_to_bf16(g.at(base + i));
      }
    });
  }

  // Rows [r0, r1) of an I8 weight: each row's values rounded to the float model's dtype
  // (what its checkpoint holds), then RTN per row (w8a8_rtn.h).
  void fill_int8(const Gen& g, DType float_dtype, int64_t cols, int64_t r0, int64_t r1) {
    auto* out = reinterpret_cast<int8_t*>(buf.data());
    pool.parallel_for(r1 - r0, [&](int64_t b, int64_t e, int) {
      std::vector<float> w(static_cast<size_t>(cols));
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = r0 + i;
        for (int64_t c = 0; c < cols; ++c) {
          const float v = g.at(r * cols + c);
          w[c] = float_dtype == DType::kBF16  ? bf16_to_f32(f32_to_bf16(v))
                 : float_dtype == DType::kF16 ? f16_to_f32(f32_to_f16(v))
                                              : v;
        }
        last_scales[static_cast<size_t>(r)] =
            rtn_quantize_row(w.data(), cols, float_dtype, out + i * cols);
      }
    });
  }

  // Rows [r0, r1) (r0 a multiple of 128): per 128x128 block, scale = max|w| / 448 and
  // q = e4m3(w / scale), so that w ~= fp8(q) * scale.
  void fill_fp8(const Gen& g, int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
    const int64_t sc = (cols + kBlock - 1) / kBlock;
    const int64_t nbr = (r1 - r0 + kBlock - 1) / kBlock;
    auto* out = reinterpret_cast<uint8_t*>(buf.data());
    pool.parallel_for(nbr * sc, [&](int64_t b, int64_t e, int) {
      std::vector<float> w(static_cast<size_t>(kBlock * kBlock));
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t br = r0 / kBlock + blk / sc, bc = blk % sc;
        const int64_t ra = br * kBlock, rb = std::min(rows, ra + kBlock);
        const int64_t ca = bc * kBlock, cb = std::min(cols, ca + kBlock);
        float amax = 0.0f;
        for (int64_t r = ra; r < rb; ++r) {
          for (int64_t c = ca; c < cb; ++c) {
            const float v = g.at(r * cols + c);
            w[(r - ra) * kBlock + (c - ca)] = v;
            amax = std::max(amax, std::fabs(v));
          }
        }
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        last_scales[static_cast<size_t>(br * sc + bc)] = scale;
        for (int64_t r = ra; r < rb; ++r) {
          for (int64_t c = ca; c < cb; ++c) {
            out[(r - r0) * cols + c] = f32_to_f8e4m3_fast(w[(r - ra) * kBlock + (c - ca)] / scale);
          }
        }
      }
    });
  }
};

// Writes one safetensors file holding `specs` (in order).
Status write_safetensors(const std::string& path, const std::vector<const Spec*>& specs,
                         TensorWriter& tw) {
  std::vector<SafetensorsEntry> entries;
  size_t data_bytes = 0;
  for (const Spec* s : specs) {
    entries.push_back({s->name, s->dtype, s->shape, static_cast<uint64_t>(s->nbytes())});
    data_bytes += s->nbytes();
  }
  const std::string header = safetensors_header(entries);
  const size_t data_start = header.size();
  const size_t total = data_start + data_bytes;

  // Written beside the destination and renamed onto it: a reader that has the previous
  // file mapped (another process of a test run) keeps its bytes, never a truncated file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return internal_error("{}: cannot create: {}", tmp, std::strerror(errno));
  auto fail = [&](Status st) {  // no partial shard left behind
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  };
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
    return fail(
        resource_exhausted("{}: cannot reserve {} bytes: {}", path, total, std::strerror(err)));
  }
  Status st = pwrite_all(fd, path, header.data(), header.size(), 0);
  size_t pos = data_start;
  for (const Spec* s : specs) {
    if (!st.ok()) break;
    st = tw.write(fd, path, *s, pos);
    pos += s->nbytes();
  }
  if (!st.ok()) return fail(st);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return internal_error("{}: close failed: {}", tmp, std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return internal_error("{}: cannot rename {} onto it: {}", path, tmp, std::strerror(err));
  }
  return {};
}

// --router-skew: every MoE layer's e_score_correction_bias fitted to the Zipf shape
// (router_skew.h) over its gate weights as the checkpoint stores them (rounded to their
// dtype), into the bias specs' values. One layer per thread; the result does not depend on
// the thread count.
void fit_router_skew(const MkModelOptions& o, const DeepseekV3Config& c, std::vector<Spec>& specs,
                     ThreadPool& pool, double zipf_a) {
  struct Job {
    int64_t layer;
    const Spec* gate;
    Spec* bias;
  };
  std::vector<Job> jobs;
  for (int64_t l = 0; l < c.num_hidden_layers + c.num_nextn_predict_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.gate.";
    Job job{l, nullptr, nullptr};
    for (Spec& s : specs) {
      if (s.name == p + "weight") job.gate = &s;
      if (s.name == p + "e_score_correction_bias") job.bias = &s;
    }
    XDS_CHECK(job.gate && job.bias, "no router tensors for layer {}", l);
    jobs.push_back(job);
  }
  const GatingParams gating = gating_params(c);
  const RouterSkew skew{zipf_a, o.router_skew_seed};
  pool.parallel_for(static_cast<int64_t>(jobs.size()), [&](int64_t b, int64_t e, int) {
    for (int64_t j = b; j < e; ++j) {
      const Job& job = jobs[static_cast<size_t>(j)];
      const Gen g = make_gen(*job.gate, o.seed);
      std::vector<float> gate(static_cast<size_t>(job.gate->numel()));  // [n_experts, hidden]
      for (size_t i = 0; i < gate.size(); ++i) {
        const float v = g.at(static_cast<int64_t>(i));
        gate[i] = job.gate->dtype == DType::kF16 ? f16_to_f32(f32_to_f16(v))
                                                 : bf16_to_f32(f32_to_bf16(v));
      }
      job.bias->values = router_skew_bias(gating, gate, c.hidden_size, skew, job.layer);
    }
  });
}

}  // namespace

uint8_t f32_to_f8e4m3_fast(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;          // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448: saturate
  if (a < 0x3c800000u) {                     // < 2^-6: subnormal, multiples of 2^-9
    const float q = std::nearbyint(std::bit_cast<float>(a) * 512.0f);  // 0..8, ties to even
    return sign | static_cast<uint8_t>(q);  // 8 is the smallest normal, code 0x08
  }
  // Normal: keep 3 mantissa bits, round to nearest even on the dropped 20 bits.
  const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // (f32 exp << 3) | man3
  const uint32_t code = r - ((127u - 7u) << 3);
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7e));
}

namespace {

// Writes `specs` into o.out_dir as o.shards safetensors files (+ the index when sharded):
// contiguous runs of ~total/shards bytes, a weight and its scales together.
Status write_tensor_files(const MkModelOptions& o, const std::vector<Spec>& specs,
                          ThreadPool& pool) {
  size_t total = 0;
  for (const Spec& s : specs) total += s.nbytes();
  const int n = o.shards;
  std::vector<std::vector<const Spec*>> shards(static_cast<size_t>(n));
  size_t acc = 0, k = 0;
  for (const Spec& s : specs) {
    if (!s.is_scale) {  // scales follow their weight into its shard
      k = std::min<size_t>(
          static_cast<size_t>(n) - 1,
          static_cast<size_t>(static_cast<double>(acc) * n / std::max<size_t>(total, 1)));
    }
    shards[k].push_back(&s);
    acc += s.nbytes();
  }
  std::vector<std::string> names;
  if (n == 1) {
    names.push_back("model.safetensors");
  } else {
    for (int i = 0; i < n; ++i) {
      names.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n));
    }
  }
  Progress progress;
  progress.total = total;
  progress.enabled = o.progress && total > kProgressBytes;
  TensorWriter tw{pool, o.seed, progress, {}, {}};
  for (int i = 0; i < n; ++i) {
    XDS_RETURN_IF_ERROR(write_safetensors(o.out_dir + "/" + names[i], shards[i], tw));
  }
  if (progress.enabled) std::fprintf(stderr, "\n");

  // A stale single file or index from an earlier run would shadow or contradict this one.
  std::error_code ec;
  const std::string index_path = o.out_dir + "/model.safetensors.index.json";
  if (n == 1) {
    std::filesystem::remove(index_path, ec);
  } else {
    std::filesystem::remove(o.out_dir + "/model.safetensors", ec);
    ojson wm = ojson::object();
    for (int i = 0; i < n; ++i) {
      for (const Spec* s : shards[i]) wm[s->name] = names[i];
    }
    ojson index = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
    XDS_RETURN_IF_ERROR(write_text(index_path, index.dump(2) + "\n"));
  }
  return {};
}

int thread_count(const MkModelOptions& o) {
  return o.threads > 0 ? o.threads
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// --from: the specs of an RTN W8A8 copy of `ckpt` (every tensor, in name order).
Result<std::vector<Spec>> copy_specs(const Checkpoint& ckpt, bool int8_head) {
  std::vector<Spec> specs;
  for (const std::string& name : ckpt.names()) {
    const TensorView* t = ckpt.find(name);
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32) {
      return invalid_argument("{}: tensor '{}': dtype {}: the W8A8 copy reads BF16, F16 or F32",
                              t->file, name, dtype_name(t->dtype));
    }
    Spec s{name, t->shape, t->dtype, Init::kLinear, false, {}, t, t->dtype};
    if (!w8a8_rtn_target(name, int8_head) || t->shape.size() != 2) {
      specs.push_back(std::move(s));
      continue;
    }
    s.dtype = DType::kI8;
    const int64_t rows = t->shape[0];
    specs.push_back(std::move(s));
    specs.push_back({name + "_scale", {rows, 1}, t->dtype, Init::kLinear, true, {}});
  }
  return specs;
}

Status write_w8a8_copy(const MkModelOptions& o) {
  if (!o.weights_int8) return invalid_argument("mkmodel: --from needs --weights-int8");
  if (!o.router_skew.empty()) return invalid_argument("mkmodel: --from takes no --router-skew");
  const std::string src_config = o.from_dir + "/config.json";
  XDS_ASSIGN_OR_RETURN(const DeepseekV3Config src_c, load_deepseek_v3_config(o.from_dir));
  if (src_c.fp8 || src_c.int_quant) {
    return invalid_argument("{}: field 'quantization_config': expected none (a float model)",
                            src_config);
  }
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(src_config));
  ojson config = ojson::parse(text);
  config["quantization_config"] = w8a8_quantization_json(w8a8_rtn_ignore(o.int8_head_and_kv_b));
  const std::string config_text = config.dump(2) + "\n";
  XDS_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(o.from_dir));
  XDS_ASSIGN_OR_RETURN(std::vector<Spec> specs, copy_specs(ckpt, o.int8_head_and_kv_b));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return internal_error("{}: cannot create the directory: {}", o.out_dir, ec.message());
  XDS_RETURN_IF_ERROR(parse_deepseek_v3_config(config_text, o.out_dir + "/config.json").status());
  XDS_RETURN_IF_ERROR(copy_checkpoint_side_files(o.from_dir, o.out_dir));
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/config.json", config_text));
  ThreadPool pool(thread_count(o));
  return write_tensor_files(o, specs, pool);
}

}  // namespace

Status write_random_tensors(const MkModelOptions& o, const std::vector<RandomTensor>& tensors,
                            DType dtype) {
  std::vector<Spec> specs;
  for (const RandomTensor& t : tensors)
    specs.push_back(
        {t.name, t.shape, t.f32 ? DType::kF32 : dtype, static_cast<Init>(t.init), false, {}});
  ThreadPool pool(thread_count(o));
  return write_tensor_files(o, specs, pool);
}

Status write_random_checkpoint(const MkModelOptions& o) {
  if (o.out_dir.empty()) return invalid_argument("mkmodel: --out is required");
  if (o.int8_head_and_kv_b && !o.weights_int8 && o.weights_int4.empty()) {
    return invalid_argument("mkmodel: --int8-head-and-kv-b needs --weights-int8 or --weights-int4");
  }
  if (o.arch == "qwen3_moe") return write_qwen3_checkpoint(o);   // qwen3_checkpoint.h
  if (o.arch == "glm4_moe") return write_glm4_checkpoint(o);     // glm4_checkpoint.h
  if (!o.weights_int4.empty()) return write_int4_checkpoint(o);  // int4_checkpoint.h
  if (!o.from_dir.empty()) return write_w8a8_copy(o);
  XDS_ASSIGN_OR_RETURN(DeepseekV3Config c, mkmodel_config(o));
  if (o.weights_int8 && c.fp8) return invalid_argument("mkmodel: --weights-int8 with dtype fp8");
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return internal_error("{}: cannot create the directory: {}", o.out_dir, ec.message());

  const bool f16 = o.dtype == "f16";
  ojson config = mkmodel_config_json(c);
  if (f16) config["torch_dtype"] = "float16";
  if (o.weights_int8) {
    config["quantization_config"] = w8a8_quantization_json(w8a8_rtn_ignore(o.int8_head_and_kv_b));
  }
  const std::string config_text = config.dump(2) + "\n";
  // The config must read back as the same model (guards the key names above).
  XDS_RETURN_IF_ERROR(parse_deepseek_v3_config(config_text, o.out_dir + "/config.json").status());
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/config.json", config_text));
  ojson gen = {{"_from_model_config", true}, {"bos_token_id", 0}, {"eos_token_id", 1}};
  XDS_RETURN_IF_ERROR(write_text(o.out_dir + "/generation_config.json", gen.dump(2) + "\n"));

  std::vector<Spec> specs =
      tensor_specs(c, c.fp8.has_value(), f16 ? DType::kF16 : DType::kBF16, o.weights_int8,
                   o.int8_head_and_kv_b);
  ThreadPool pool(thread_count(o));
  if (!o.router_skew.empty()) {
    XDS_ASSIGN_OR_RETURN(const double zipf_a, parse_router_skew(o.router_skew));
    fit_router_skew(o, c, specs, pool, zipf_a);
  }
  return write_tensor_files(o, specs, pool);
}

}  // namespace xds

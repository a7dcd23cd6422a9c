#include "quant/quantize.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "base/bf16.h"
#include "base/read_file.h"
#include "model/deepseek_v3/config.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/quant_config.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "quant/calibration.h"
#include "quant/checkpoint_writer.h"
#include "quant/gptq.h"
#include "quant/smooth_quant.h"
#include "quant/w4_pack.h"
#include "quant/w8a8_rtn.h"
#include "tokenizer/tokenizer.h"

namespace xds {
namespace {

using ojson = nlohmann::ordered_json;

// The values of a BF16, F16 or F32 tensor (the caller checked the dtype).
std::vector<float> to_floats(const TensorView& t) {
  const int64_t n = t.numel();
  std::vector<float> v(static_cast<size_t>(n));
  if (t.dtype == DType::kF32) {
    std::memcpy(v.data(), t.data, sizeof(float) * static_cast<size_t>(n));
    return v;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(t.data);
  for (int64_t i = 0; i < n; ++i) v[i] = t.dtype == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  return v;
}

// v rounded to dt (BF16, F16 or F32), as stored bytes.
std::vector<std::byte> from_floats(std::span<const float> v, DType dt) {
  std::vector<std::byte> out(v.size() * static_cast<size_t>(dtype_size(dt)));
  if (dt == DType::kF32) {
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < v.size(); ++i) h[i] = dt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return out;
}

// Calibration window starts: `samples` evenly spaced over `n` tokens, then rounds between
// them (offsets 1/2, 1/4, 3/4, 1/8, ... of the spacing: the van der Corput sequence).
int64_t window_start(int64_t i, int64_t samples, int64_t n, int64_t window) {
  const int64_t span = std::max<int64_t>(n - window, 0);
  const int64_t stride = std::max<int64_t>(span / std::max<int64_t>(samples, 1), 1);
  int64_t round = i / samples, k = i % samples;
  double frac = 0.0, unit = 0.5;
  for (; round > 0; round >>= 1, unit /= 2) frac += (round & 1) * unit;
  return std::min(span, k * stride + static_cast<int64_t>(frac * static_cast<double>(stride)));
}

// A block-FP8 weight ("<name>" F8_E4M3 with "<name>_scale_inv" F32) of a checkpoint whose
// quantization_config is fp8 (nullptr otherwise).
const TensorView* fp8_scale_of(const Checkpoint& ckpt, const std::optional<Fp8Quantization>& fp8,
                               const TensorView& t) {
  if (!fp8 || t.dtype != DType::kF8E4M3) return nullptr;
  return ckpt.find(t.name + "_scale_inv");
}

// The float values of a source tensor: BF16/F16/F32 widened, block FP8 dequantized.
std::vector<float> source_floats(const Checkpoint& ckpt, const std::optional<Fp8Quantization>& fp8,
                                 const TensorView& t) {
  const TensorView* s = fp8_scale_of(ckpt, fp8, t);
  if (s == nullptr) return to_floats(t);
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<float> v(static_cast<size_t>(rows * cols));
  dequantize_fp8_block_rows(reinterpret_cast<const uint8_t*>(t.data),
                            reinterpret_cast<const float*>(s->data), rows, cols, fp8->block_rows,
                            fp8->block_cols, 0, rows, v.data());
  return v;
}

// The dtype a source tensor is written in when not quantized (and of the scales of the
// quantized ones): its own, BF16 for block FP8.
DType float_dtype(const TensorView& t) { return t.dtype == DType::kF8E4M3 ? DType::kBF16 : t.dtype; }

struct Run {
  const QuantizeOptions& o;
  const Checkpoint& ckpt;
  const std::optional<Fp8Quantization>& fp8;
  const Calibrator& calib;
  std::map<std::string, std::vector<float>> changed;  // float tensors the smoothing rewrote
  std::map<std::string, QuantizedLinear> quantized;   // w8a8
  std::map<std::string, W4Linear> quantized_w4;       // w4a16, w4a8
  std::vector<std::string> float_modules;  // 4-bit: targets kept float (width not a multiple of G)
  std::map<std::string, std::vector<float>> smooth;  // linear -> its input's scales s
  ojson linears = ojson::object();                    // the report's per-linear entries

  bool has(const std::string& name) const { return ckpt.find(name) != nullptr; }
  bool w4() const { return o.scheme != "w8a8"; }
  int64_t group() const { return o.group_size > 0 ? o.group_size : 128; }
  // SmoothQuant only where the activations are int8 (it trades activation range for
  // weight range, a loss for weight-only W4A16).
  bool smooths() const { return o.smooth_alpha >= 0.0 && o.scheme != "w4a16"; }
  std::vector<float>& floats(const std::string& name) {
    auto it = changed.find(name);
    if (it == changed.end())
      it = changed.emplace(name, source_floats(ckpt, fp8, *ckpt.find(name))).first;
    return it->second;
  }
};

// SmoothQuant over `members` (quantized linears reading the output of norm `norm`) and
// `router` (also reading it, not quantized; empty if none); act_max from `source`'s stats.
void smooth_group(Run& r, std::vector<float>& wnorm, const std::vector<std::string>& members,
                  const std::string& router, const std::string& source,
                  std::map<std::string, std::vector<float>>& weights) {
  const auto st = r.calib.stats().find(source);
  if (members.empty() || st == r.calib.stats().end() || st->second.tokens == 0) return;
  const int64_t cols = st->second.cols;
  std::vector<float> wmax(static_cast<size_t>(cols), 0.0f);
  for (const std::string& m : members) {
    const std::vector<float>& w = weights.at(m);
    accumulate_column_max(w, static_cast<int64_t>(w.size()) / cols, cols, wmax);
  }
  const std::vector<float> s = smooth_scales(st->second.act_max, wmax, r.o.smooth_alpha);
  for (const std::string& m : members) {
    std::vector<float>& w = weights.at(m);
    scale_columns(w, static_cast<int64_t>(w.size()) / cols, cols, s);
    r.smooth[m] = s;
  }
  if (!router.empty()) {
    std::vector<float>& g = r.floats(router);
    scale_columns(g, static_cast<int64_t>(g.size()) / cols, cols, s);
  }
  divide_by(wnorm, s);
}

// One decoder (or MTP) layer: smoothing, then each linear quantized. Returns the progress line.
Result<std::string> quantize_layer(Run& r, int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  std::map<std::string, std::vector<float>> weights;  // the layer's quantized linears
  std::map<std::string, DType> dtypes;
  for (const std::string& name : r.ckpt.names()) {
    if (!name.starts_with(p) || !w8a8_rtn_target(name)) continue;
    const TensorView* t = r.ckpt.find(name);
    if (t->shape.size() != 2) {
      return invalid_argument("{}: tensor '{}': shape {}: a linear weight is 2-D", t->file, name,
                              t->shape_string());
    }
    weights.emplace(name, source_floats(r.ckpt, r.fp8, *t));
    dtypes.emplace(name, float_dtype(*t));
  }
  if (r.smooths()) {
    std::vector<std::string> attn;
    for (const char* m : {"self_attn.q_a_proj.weight", "self_attn.q_proj.weight",
                          "self_attn.kv_a_proj_with_mqa.weight"}) {
      if (weights.count(p + m)) attn.push_back(p + m);
    }
    if (r.has(p + "input_layernorm.weight") && !attn.empty()) {
      smooth_group(r, r.floats(p + "input_layernorm.weight"), attn, "", attn.front(), weights);
    }
    std::vector<std::string> mlp;
    for (const auto& [name, w] : weights) {
      if (name.find(".mlp.") != std::string::npos &&
          (name.ends_with(".gate_proj.weight") || name.ends_with(".up_proj.weight")))
        mlp.push_back(name);
    }
    const std::string source = weights.count(p + "mlp.gate_proj.weight")
                                   ? p + "mlp.gate_proj.weight"
                                   : p + "mlp.shared_experts.gate_proj.weight";
    const std::string router = r.has(p + "mlp.gate.weight") ? p + "mlp.gate.weight" : "";
    if (r.has(p + "post_attention_layernorm.weight") && !mlp.empty()) {
      smooth_group(r, r.floats(p + "post_attention_layernorm.weight"), mlp, router, source,
                   weights);
    }
  }
  if (r.o.smooth_only) {
    for (auto& [name, w] : weights) r.changed[name] = std::move(w);
    return fmt::format("{} linears smoothed", weights.size());
  }
  int64_t n_gptq = 0, n_rtn = 0;
  double sum_rtn = 0.0, sum_gptq = 0.0;
  for (auto& [name, w] : weights) {
    const TensorView* t = r.ckpt.find(name);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const auto st = r.calib.stats().find(name);
    const int64_t tokens = st == r.calib.stats().end() ? 0 : st->second.tokens;
    ojson entry = {{"tokens", tokens}};
    if (r.w4() && cols % r.group() != 0) {  // stays float (smoothed), listed in `ignore`
      entry["method"] = "none";
      entry["reason"] = fmt::format("input width {} is not a multiple of the group size {}",
                                    cols, r.group());
      r.float_modules.push_back(name.substr(0, name.size() - 7));
      r.changed[name] = std::move(w);
      r.linears[name] = entry;
      continue;
    }
    const DType sdt = dtypes.at(name);
    const bool sym = true;
    QuantizedLinear rtn;
    W4Linear rtn4;
    if (r.w4()) {
      rtn4 = rtn_w4_quantize(w, rows, cols, r.group(), sym, sdt);
    } else {
      rtn = rtn_quantize(w, rows, cols, sdt);
    }
    auto keep_rtn = [&] {
      if (r.w4()) {
        r.quantized_w4.emplace(name, std::move(rtn4));
      } else {
        r.quantized.emplace(name, std::move(rtn));
      }
      ++n_rtn;
    };
    if (tokens == 0) {
      entry["method"] = "rtn";
      entry["reason"] = "no calibration tokens";
      keep_rtn();
      r.linears[name] = entry;
      continue;
    }
    std::vector<double> h = st->second.hessian;  // of the smoothed inputs x / s
    if (const auto s = r.smooth.find(name); s != r.smooth.end()) {
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t j = 0; j < cols; ++j) h[i * cols + j] /= double(s->second[i]) * s->second[j];
    }
    const double err_rtn = r.w4() ? relative_output_error(w, rows, cols, rtn4, h)
                                  : relative_output_error(w, rows, cols, rtn, h);
    entry["error_rtn"] = err_rtn;
    const bool expert = name.find(".mlp.experts.") != std::string::npos;
    if (r.o.method == "rtn" || (expert && tokens < r.o.min_expert_samples)) {
      entry["method"] = "rtn";
      if (r.o.method != "rtn") entry["reason"] = "fewer tokens than --min-expert-samples";
      keep_rtn();
      if (r.o.method == "rtn") sum_rtn += err_rtn;
    } else {
      double err = 0.0;
      if (r.w4()) {
        GptqW4Options go;
        go.damp = r.o.damp;
        go.group_size = r.group();
        go.symmetric = sym;
        go.scale_dtype = sdt;
        XDS_ASSIGN_OR_RETURN(W4Linear q, gptq_w4_quantize(w, rows, cols, h, go));
        err = relative_output_error(w, rows, cols, q, h);
        r.quantized_w4.emplace(name, std::move(q));
      } else {
        GptqOptions go;
        go.damp = r.o.damp;
        go.scale_dtype = sdt;
        XDS_ASSIGN_OR_RETURN(QuantizedLinear q, gptq_quantize(w, rows, cols, h, go));
        err = relative_output_error(w, rows, cols, q, h);
        r.quantized.emplace(name, std::move(q));
      }
      entry["method"] = "gptq";
      entry["error_gptq"] = err;
      ++n_gptq;
      sum_rtn += err_rtn;
      sum_gptq += err;
    }
    r.linears[name] = entry;
  }
  // Means over the GPTQ linears (method gptq) or over the calibrated ones (method rtn).
  std::string line = fmt::format("{} linears ({} GPTQ, {} RTN)", weights.size(), n_gptq, n_rtn);
  if (n_gptq > 0) {
    line += fmt::format(", mean relative output error RTN {:.3e} -> GPTQ {:.3e}",
                        sum_rtn / double(n_gptq), sum_gptq / double(n_gptq));
  } else if (r.o.method == "rtn" && n_rtn > 0) {
    line += fmt::format(", mean relative output error RTN {:.3e}", sum_rtn / double(n_rtn));
  }
  return line;
}

// --int8-head-and-kv-b: lm_head, the MTP layers' shared_head.head and every kv_b_proj as
// W8A8 linears by RTN per output row (w8a8_rtn.h). Not calibrated: they read no smoothed
// norm, the calibration run observes only the layers' targets (kv_b_proj's absorbed products
// are per head, lm_head is not a layer's), and a per-row RTN at 8 bits already keeps each
// row's error below half a step of its absmax / 127.
Status quantize_head_and_kv_b(Run& r) {
  for (const std::string& name : r.ckpt.names()) {
    if (!w8a8_head_or_kv_b(name)) continue;
    const TensorView* t = r.ckpt.find(name);
    if (t->shape.size() != 2) {
      return invalid_argument("{}: tensor '{}': shape {}: a linear weight is 2-D", t->file, name,
                              t->shape_string());
    }
    const std::vector<float> w = source_floats(r.ckpt, r.fp8, *t);
    r.quantized.emplace(name, rtn_quantize(w, t->shape[0], t->shape[1], float_dtype(*t)));
    r.linears[name] = {{"tokens", 0},
                       {"method", "rtn"},
                       {"reason", "--int8-head-and-kv-b: lm_head and kv_b_proj are not calibrated"}};
  }
  return {};
}

Status write_text_file(const std::string& path, const std::string& text) {
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(text));
  return f.commit();
}

// The output tensors: every source tensor in name order, quantized linears as I8 weight +
// weight_scale, smoothed float tensors rewritten in their dtype, block-FP8 ones as BF16
// (their _scale_inv dropped), the rest copied.
std::vector<OutTensor> output_tensors(const Run& r) {
  std::vector<OutTensor> out;
  for (const std::string& name : r.ckpt.names()) {
    const TensorView* t = r.ckpt.find(name);
    const DType dt = float_dtype(*t);
    if (name.ends_with("_scale_inv") && r.fp8) {
      const TensorView* w = r.ckpt.find(name.substr(0, name.size() - 10));
      if (w != nullptr && w->dtype == DType::kF8E4M3) continue;
    }
    if (const auto q = r.quantized_w4.find(name); q != r.quantized_w4.end()) {
      append_pack_quantized(name.substr(0, name.size() - 7), q->second, true, dt, out);
      continue;
    }
    if (const auto q = r.quantized.find(name); q != r.quantized.end()) {
      const int64_t rows = t->shape[0];
      OutTensor w{name, DType::kI8, t->shape, std::vector<std::byte>(q->second.q.size())};
      std::memcpy(w.bytes.data(), q->second.q.data(), q->second.q.size());
      out.push_back(std::move(w));
      out.push_back({name + "_scale", dt, {rows, 1}, from_floats(q->second.scale, dt)});
      continue;
    }
    if (const auto c = r.changed.find(name); c != r.changed.end()) {
      out.push_back({name, dt, t->shape, from_floats(c->second, dt)});
      continue;
    }
    if (fp8_scale_of(r.ckpt, r.fp8, *t) != nullptr) {
      out.push_back({name, dt, t->shape, from_floats(source_floats(r.ckpt, r.fp8, *t), dt)});
      continue;
    }
    OutTensor o{name, t->dtype, t->shape, std::vector<std::byte>(t->nbytes)};
    std::memcpy(o.bytes.data(), t->data, t->nbytes);
    out.push_back(std::move(o));
  }
  return out;
}

Status quantize_into(const QuantizeOptions& o, const std::string& tmp) {
  XDS_ASSIGN_OR_RETURN(const std::string family, causal_lm_type(o.model_dir));
  if (family != "deepseek_v3") {
    return unimplemented(
        "{}: quantize runs DeepSeek-V3 checkpoints only; this one is model_type '{}' (not "
        "supported by quantize yet)",
        o.model_dir, family);
  }
  XDS_ASSIGN_OR_RETURN(const DeepseekV3Config c, load_deepseek_v3_config(o.model_dir));
  if (c.int_quant) {
    return unimplemented(
        "{}/config.json: field 'quantization_config': quantize reads BF16, F16, "
        "F32 or block-FP8 checkpoints (this one is already {})",
        o.model_dir, int_scheme_name(c.int_quant->scheme));
  }
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(o.calibration_file));
  XDS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(o.model_dir));
  XDS_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tok.encode(text, false));
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t window = std::min(o.window, c.max_position_embeddings);
  if (n < 2) return invalid_argument("{}: {} tokens: too little calibration text", o.calibration_file, n);

  ModelOptions mo;
  mo.compute = ComputeDType::kF32;
  mo.threads = o.threads;
  XDS_ASSIGN_OR_RETURN(auto model, DeepseekV3Model::load(o.model_dir, mo));
  XDS_ASSIGN_OR_RETURN(auto calib, Calibrator::attach(*model));
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Enough windows: `samples`, then more until every expert has its tokens (or the text
  // runs out: max_windows non-overlapping windows' worth).
  const int64_t max_windows = std::max(o.samples, (n + window - 1) / window);
  auto experts_short = [&] {
    int64_t k = 0;
    for (const auto& [layer, counts] : calib->expert_tokens())
      for (int64_t t : counts) k += t < o.min_expert_samples;
    return k;
  };
  int64_t windows = 0, tokens = 0;
  for (; windows < max_windows && (windows < o.samples || experts_short() > 0); ++windows) {
    const int64_t start = window_start(windows, o.samples, n, window);
    const int64_t len = std::min(window, n - start);
    XDS_RETURN_IF_ERROR(calib->run_window(std::span<const int32_t>(ids).subspan(start, len)));
    tokens += len;
    if (o.progress) {
      std::fprintf(stderr,
                   "\rquantize: calibration window %lld, %lld tokens, %lld experts below %lld "
                   "tokens, %.1f s",
                   static_cast<long long>(windows + 1), static_cast<long long>(tokens),
                   static_cast<long long>(experts_short()),
                   static_cast<long long>(o.min_expert_samples), seconds());
    }
  }
  if (o.progress) std::fprintf(stderr, "\n");
  calib->finish();

  XDS_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(o.model_dir));
  for (const std::string& name : ckpt.names()) {
    const TensorView* t = ckpt.find(name);
    const bool fp8 = t->dtype == DType::kF8E4M3 && t->shape.size() == 2 &&
                     fp8_scale_of(ckpt, c.fp8, *t) != nullptr;
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32 && !fp8) {
      return invalid_argument(
          "{}: tensor '{}': dtype {}: quantize reads BF16, F16, F32 or block FP8 (2-D F8_E4M3 "
          "with its _scale_inv and an fp8 quantization_config)",
          t->file, name, dtype_name(t->dtype));
    }
  }
  Run run{o, ckpt, c.fp8, *calib, {}, {}, {}, {}, {}};
  const int64_t layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  for (int64_t l = 0; l < layers; ++l) {
    XDS_ASSIGN_OR_RETURN(const std::string line, quantize_layer(run, l));
    if (o.progress) {
      std::fprintf(stderr, "quantize: layer %lld/%lld%s: %s, %.1f s\n", static_cast<long long>(l + 1),
                   static_cast<long long>(layers), l >= c.num_hidden_layers ? " (MTP)" : "",
                   line.c_str(), seconds());
    }
  }

  if (o.int8_head_and_kv_b && !o.smooth_only) XDS_RETURN_IF_ERROR(quantize_head_and_kv_b(run));

  XDS_ASSIGN_OR_RETURN(const std::string config_text, read_whole_file(o.model_dir + "/config.json"));
  ojson config = ojson::parse(config_text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return invalid_argument("{}/config.json: not a JSON object", o.model_dir);
  }
  config.erase("quantization_config");  // block FP8 (now BF16) or none
  if (!o.smooth_only && run.w4()) {
    std::vector<std::string> ignore = w8a8_rtn_ignore(o.int8_head_and_kv_b);
    ignore.insert(ignore.end(), run.float_modules.begin(), run.float_modules.end());
    // --int8-head-and-kv-b: a second, int8 group for lm_head, kv_b_proj and shared_head.head.
    config["quantization_config"] =
        o.int8_head_and_kv_b
            ? w4_int8_head_quantization_json(run.group(), true, o.scheme == "w4a8", ignore)
            : w4_pack_quantized_json(run.group(), true, o.scheme == "w4a8", ignore);
  } else if (!o.smooth_only) {
    config["quantization_config"] =
        w8a8_quantization_json(w8a8_rtn_ignore(o.int8_head_and_kv_b));
  }
  const std::string out_config = config.dump(2) + "\n";
  XDS_RETURN_IF_ERROR(parse_deepseek_v3_config(out_config, tmp + "/config.json").status());
  XDS_RETURN_IF_ERROR(copy_checkpoint_side_files(o.model_dir, tmp, {"quantize_report.json"}));
  XDS_RETURN_IF_ERROR(write_text_file(tmp + "/config.json", out_config));
  XDS_RETURN_IF_ERROR(write_sharded_safetensors(tmp, output_tensors(run), o.max_shard_bytes));

  ojson below = ojson::array();
  for (const auto& [layer, counts] : calib->expert_tokens()) {
    for (size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] < o.min_expert_samples)
        below.push_back({{"layer", layer}, {"expert", e}, {"tokens", counts[e]}});
    }
  }
  const ojson report = {
      {"source", o.model_dir},
      {"scheme", o.scheme},
      {"group_size", run.w4() ? ojson(run.group()) : ojson(nullptr)},
      {"method", o.method},
      {"smooth_alpha", run.smooths() ? ojson(o.smooth_alpha) : ojson(nullptr)},
      {"gptq_damp", o.damp},
      {"calibration", {{"file", o.calibration_file}, {"windows", windows}, {"window", window},
                       {"tokens", tokens}}},
      {"min_expert_samples", o.min_expert_samples},
      {"experts_below_min", below},
      {"linears", run.linears}};
  XDS_RETURN_IF_ERROR(write_text_file(tmp + "/quantize_report.json", report.dump(2) + "\n"));
  if (!below.empty() && o.progress) {
    std::fprintf(stderr, "quantize: %zu experts saw fewer than %lld tokens: RTN for them "
                 "(quantize_report.json, experts_below_min)\n", below.size(),
                 static_cast<long long>(o.min_expert_samples));
  }
  return {};
}

}  // namespace

Status quantize_checkpoint(const QuantizeOptions& o) {
  if (o.method != "gptq" && o.method != "rtn") {
    return invalid_argument("quantize: --method \"{}\" (expected gptq or rtn)", o.method);
  }
  if (o.scheme != "w8a8" && o.scheme != "w4a16" && o.scheme != "w4a8") {
    return invalid_argument("quantize: --scheme \"{}\" (expected w8a8, w4a16 or w4a8)", o.scheme);
  }
  if (o.scheme == "w8a8" && o.group_size != 0) {
    return invalid_argument(
        "quantize: --group-size {} is for the 4-bit schemes (--scheme w4a16 or w4a8); w8a8 "
        "has one scale per output row",
        o.group_size);
  }
  if (o.group_size != 0 && o.group_size != 32 && o.group_size != 64 && o.group_size != 128) {
    return invalid_argument("quantize: --group-size {} (expected 32, 64 or 128)", o.group_size);
  }
  if (o.samples < 1) return invalid_argument("quantize: --samples {} (at least 1)", o.samples);
  if (o.window < 2) return invalid_argument("quantize: --window {} (at least 2)", o.window);
  if (o.smooth_alpha > 1.0) {
    return invalid_argument("quantize: --smooth-alpha {} (at most 1; negative: no smoothing)",
                            o.smooth_alpha);
  }
  if (o.out_dir.empty()) return invalid_argument("quantize: --out is required");
  std::error_code ec;
  if (std::filesystem::exists(o.out_dir, ec)) {
    return failed_precondition("{}: already exists (quantize writes a new directory)", o.out_dir);
  }
  std::filesystem::path out = std::filesystem::absolute(o.out_dir, ec);
  const std::string tmp = out.string() + ".tmp." + std::to_string(::getpid());
  std::filesystem::create_directories(tmp, ec);
  if (ec) return internal_error("{}: cannot create the directory: {}", tmp, ec.message());
  Status s = quantize_into(o, tmp);
  if (s.ok()) {
    std::filesystem::rename(tmp, out, ec);
    if (ec) s = internal_error("{}: cannot rename onto {}: {}", tmp, out.string(), ec.message());
  }
  if (!s.ok()) std::filesystem::remove_all(tmp, ec);
  return s;
}

}  // namespace xds

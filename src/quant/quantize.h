// `xdeepserve quantize`: an offline W8A8, W4A16 or W4A8 copy of a DeepSeek-V3 checkpoint in
// BF16, F16, F32 or block FP8 (dequantized; its other FP8 tensors, kv_b_proj, written as
// BF16) (docs/design/quantize.md).
//
//   1. calibration: the float model (f32 compute) runs over windows of the calibration text
//      (quant/calibration.h): at least `samples` windows, spread evenly over the text, then
//      more until every routed expert has seen `min_expert_samples` tokens or the text is
//      spent;
//   2. per decoder layer (MTP layers too): SmoothQuant (quant/smooth_quant.h) on the two
//      groups of linears reading a norm's output (q_a + kv_a after input_layernorm; the dense
//      MLP's, or the shared and every routed expert's gate/up plus the router gate, after
//      post_attention_layernorm), folded into the norm (only for the schemes with int8
//      activations, w8a8 and w4a8); then GPTQ (quant/gptq.h: per-row INT8, or 4-bit groups
//      of group_size) of every quantized linear on its (smoothed) Hessian, or RTN for
//      `method` rtn and for experts below min_expert_samples;
//   3. the checkpoint in the compressed-tensors W8A8 layout the runtime loads
//      (model/quant_config.h, quant/w8a8_rtn.h): config.json gains quantization_config,
//      each quantized linear is `weight` I8 [out, in] + `weight_scale` [out, 1] in the float
//      model's dtype, every other tensor is kept in its dtype (norms and router gates with
//      the smoothing folded in), safetensors shards + model.safetensors.index.json, the
//      source's other files copied, and quantize_report.json (see write_report).
//      The 4-bit schemes write compressed-tensors pack-quantized instead (quant/w4_pack.h,
//      symmetric, actorder "weight" semantics: no g_idx), input_activations null (w4a16) or
//      per-token dynamic int8 (w4a8); a linear whose input width is not a multiple of
//      group_size stays float and is added to `ignore`.
// Everything is written into "<out>.tmp.<pid>" and renamed onto `out` at the end: an
// interrupted or failed run leaves no `out`.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace xds {

struct QuantizeOptions {
  std::string model_dir;
  std::string out_dir;           // must not exist
  std::string calibration_file;  // UTF-8 text (never the held-out text)
  int64_t samples = 32;          // calibration windows, at least
  int64_t window = 256;          // tokens per window
  double smooth_alpha = 0.5;     // SmoothQuant migration strength in [0, 1]; < 0: none
  std::string scheme = "w8a8";   // "w8a8", "w4a16" or "w4a8"
  int64_t group_size = 0;        // 4-bit schemes: 32, 64 or 128 (0: 128); w8a8: must be 0
  std::string method = "gptq";   // "gptq" or "rtn"
  // w8a8 only: lm_head, the MTP layers' shared_head.head and every kv_b_proj written as
  // W8A8 linears too (RTN per output row, not calibrated), and left out of `ignore`
  // (quant/w8a8_rtn.h head_and_kv_b). With w4a16 / w4a8 the config gains a second, int8
  // group targeting them (model/quant_config.h layout 2b).
  bool int8_head_and_kv_b = false;
  int64_t min_expert_samples = 4;
  double damp = 0.01;                     // GPTQ relative damping
  int64_t max_shard_bytes = int64_t{4} << 30;  // per safetensors file
  int threads = 0;                        // 0: one per core
  bool progress = true;                   // a line per layer on stderr
  // Stop after step 2's smoothing: the smoothed float checkpoint (no quantization_config),
  // which must compute what the source computes (tests).
  bool smooth_only = false;
};

Status quantize_checkpoint(const QuantizeOptions& o);

}  // namespace xds

// Integer-quantized checkpoints: config.json's quantization_config, the scheme it gives the
// linears (IntQuantization: W8A8, W4A16 or W4A8) and which linear modules it quantizes. Three
// layouts are accepted; every other value of a field below fails with InvalidArgument
// "<file>: field 'quantization_config.<path>': expected ..., found ...".
//
// 1. W8A8, compressed-tensors "int-quantized" (the field paths below are what an error names):
//
//   quantization_config = {
//     quant_method: "compressed-tensors", format: "int-quantized",
//     config_groups: {"<one group>": {
//       targets: ["Linear"],
//       weights:           {num_bits 8, type "int", symmetric true, strategy "channel",
//                           dynamic false, group_size null, block_structure null, actorder null},
//       input_activations: {num_bits 8, type "int", symmetric true, strategy "token",
//                           dynamic true, group_size null, block_structure null},
//       output_activations: null}},
//     ignore: ["lm_head", "re:.*mlp\\.gate$", ...],
//     kv_cache_scheme: null, sparsity_config: null or {}, quantization_status: "compressed"
//   }
//
// Absent optional fields take the values shown.
//
// A quantized linear `<module>` stores `<module>.weight` I8 [out, in] and
// `<module>.weight_scale` [out, 1] (BF16, F16 or F32):  W[r][c] = weight[r][c] · scale[r].
// A module is quantized unless `ignore` names it: an entry is either the module's exact name
// ("lm_head") or "re:" and a regular expression (PCRE2, which reads Python's re syntax for these)
// that matches from the start of the name, as Python's re.match does ("re:.*mlp\\.gate$"). The
// router gates are treated as Linear modules (they are in the published checkpoints' ignore lists).
//
// 2. W4A16 / W4A8, compressed-tensors "pack-quantized" (llm-compressor's 4-bit layout):
//
//   quant_method "compressed-tensors", format "pack-quantized", one config group as above with
//     weights:           {num_bits 4, type "int", symmetric true|false, strategy "group",
//                         group_size 32|64|128, dynamic false, block_structure null,
//                         actorder null|"group"|"weight"}
//     input_activations: null or absent (W4A16), or the per-token dynamic int8 object of 1
//                        (W4A8)
//   and `ignore` as in 1. Tensors (model/int4_weights.h): <m>.weight_packed I32 [out, in/8],
//   <m>.weight_scale [out, in/G], <m>.weight_shape [2], asymmetric <m>.weight_zero_point I32
//   [out/8, in/G], actorder "group" <m>.weight_g_idx I32 [in] (permuted groups run).
//
// 2b. W4A16 / W4A8 with lm_head and kv_b_proj in int8: compressed-tensors "mixed-precision",
//   two config groups, each with its own `format` (in either order):
//     {targets ["Linear"], format "pack-quantized", weights and input_activations as in 2}
//     {targets: a non-empty subset of ["lm_head", "re:.*kv_b_proj$",
//                                      "re:.*shared_head\\.head$"] (no duplicates),
//      format "int-quantized", weights and input_activations as in 1}
//   A module takes the group of its most specific matching target, as compressed-tensors
//   resolves targets (exact names, then "re:" patterns, then class names such as "Linear"):
//   so the named modules are W8A8 (layout 1's tensors, int8 per-token activations, also in a
//   W4A16 checkpoint), every other Linear 4-bit; `ignore` still wins over both. Other
//   numbers of groups, other targets or other formats fail naming the field.
//
// 3. W4A16, GPTQ as Hugging Face transformers / optimum / AutoGPTQ / GPTQModel write it:
//
//   {quant_method "gptq", bits 4, group_size 32|64|128, desc_act bool, sym bool,
//    checkpoint_format absent|"gptq"|"gptq_v2"}   (other keys: damp_percent, true_sequential,
//                                                  static_groups, ... are not read)
//   "gptq" (v1, the default) stores each zero point minus 1, "gptq_v2" as it is; desc_act's
//   permuted <m>.g_idx runs as actorder "group" does. No ignore list: a module is quantized
//   where the checkpoint holds <m>.qweight, float where <m>.weight (quantized_by_tensors).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace xds {

// The product the quantized linears run: W8A8 (int8 weights, per-token int8 activations),
// W4A16 (int4 weights, float activations) or W4A8 (int4 weights, per-token int8 activations).
enum class IntScheme { kW8A8, kW4A16, kW4A8 };
// How 4-bit weights are stored (model/int4_weights.h); kNone for W8A8.
enum class Int4Format { kNone, kPackQuantized, kGptq };
// compressed-tensors actorder / GPTQ desc_act: kGroup stores a g_idx permutation of the
// columns into groups; kWeight (and kNone) keep column c in group c / G.
enum class Int4ActOrder { kNone, kGroup, kWeight };

const char* int_scheme_name(IntScheme s);  // "w8a8", "w4a16", "w4a8"

// One checkpoint's integer quantization: what the model code asks.
struct IntQuantization {
  struct IgnorePattern {
    std::string text;               // as written, without "re:"
    std::shared_ptr<const void> re;  // the compiled PCRE2 pattern (pcre2_code_8)
  };
  IntScheme scheme = IntScheme::kW8A8;
  Int4Format format = Int4Format::kNone;
  int64_t group_size = 0;  // W4: G, the input columns sharing a scale (32, 64 or 128)
  bool symmetric = true;   // W4: false, zero points stored per row and group
  Int4ActOrder actorder = Int4ActOrder::kNone;
  bool gptq_zero_minus_one = false;  // GPTQ v1: stored zero point = z - 1
  // GPTQ: no ignore list; a module is quantized where its tensors are (see above).
  bool quantized_by_tensors = false;
  std::vector<std::string> ignore_names;       // exact module names
  std::vector<IgnorePattern> ignore_patterns;  // "re:" entries
  // Layout 2b: the int8 group's targets (empty otherwise): modules that are W8A8 in a 4-bit
  // checkpoint.
  std::vector<std::string> int8_target_names;
  std::vector<IgnorePattern> int8_target_patterns;

  bool int4() const { return scheme != IntScheme::kW8A8; }
  // The scheme module `name` runs when quantized: kW8A8 for the int8 group's targets of a
  // 4-bit checkpoint (layout 2b), else `scheme`. (Whether it is quantized: quantizes.)
  IntScheme scheme_of(std::string_view module) const;
  // True when module `name` is quantized and runs W8A8 (layout 1 tensors, int8 panels).
  bool int8_module(std::string_view module) const {
    return quantizes(module) && scheme_of(module) == IntScheme::kW8A8;
  }
  // True when module `name` ("model.layers.0.self_attn.q_a_proj", no ".weight") is a target
  // of the scheme: not ignored. (quantized_by_tensors: every module; the tensors decide.)
  bool quantizes(std::string_view module) const;
};

// Parses the quantization_config object `v` (its key in config.json is `key`; `source` names
// the file), whose quant_method is "compressed-tensors" or "gptq".
Result<IntQuantization> parse_int_quantization(std::string_view source, std::string_view key,
                                               const nlohmann::json& v);

// The quantization_config written for W8A8 checkpoints (mkmodel --weights-int8): the scheme
// above with `ignore` as given.
nlohmann::ordered_json w8a8_quantization_json(const std::vector<std::string>& ignore);

// The quantization_config of a compressed-tensors pack-quantized checkpoint (mkmodel
// --weights-int4): 4-bit groups of group_size, symmetric or not, W4A16 or (int8_activations)
// W4A8, `ignore` as given.
nlohmann::ordered_json w4_pack_quantized_json(int64_t group_size, bool symmetric,
                                              bool int8_activations,
                                              const std::vector<std::string>& ignore);

// The targets of layout 2b's int8 group as quantize and mkmodel write them: lm_head, every
// kv_b_proj and the MTP layers' shared_head.head.
std::vector<std::string> int8_head_and_kv_b_targets();

// Layout 2b: w4_pack_quantized_json's config as "mixed-precision", its group "group_0" with
// format "pack-quantized", plus "group_1": W8A8 (format "int-quantized") for
// int8_head_and_kv_b_targets(). `ignore` as given (it must not list those modules).
nlohmann::ordered_json w4_int8_head_quantization_json(int64_t group_size, bool symmetric,
                                                      bool int8_activations,
                                                      const std::vector<std::string>& ignore);

// The quantization_config of a GPTQ checkpoint as transformers writes it (v1: zero points
// minus 1), desc_act false.
nlohmann::ordered_json w4_gptq_json(int64_t group_size, bool symmetric);

}  // namespace xds

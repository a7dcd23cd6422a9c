// W8A8 checkpoints in the compressed-tensors layout ("int-quantized"): config.json's
// quantization_config and which linear modules it quantizes.
//
// The one scheme accepted (the field paths below are what an error names):
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
// Absent optional fields take the values shown; any other value fails with InvalidArgument
// "<file>: field 'quantization_config.<path>': expected ..., found ...".
//
// A quantized linear `<module>` stores `<module>.weight` I8 [out, in] and
// `<module>.weight_scale` [out, 1] (BF16, F16 or F32):  W[r][c] = weight[r][c] · scale[r].
// A module is quantized unless `ignore` names it: an entry is either the module's exact name
// ("lm_head") or "re:" and a regular expression (PCRE2, which reads Python's re syntax for these) that matches from the start of
// the name, as Python's re.match does ("re:.*mlp\\.gate$"). The router gates are treated as
// Linear modules (they are in the published checkpoints' ignore lists).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace xds {

struct W8A8Quantization {
  struct IgnorePattern {
    std::string text;               // as written, without "re:"
    std::shared_ptr<const void> re;  // the compiled PCRE2 pattern (pcre2_code_8)
  };
  std::vector<std::string> ignore_names;       // exact module names
  std::vector<IgnorePattern> ignore_patterns;  // "re:" entries

  // True when module `name` ("model.layers.0.self_attn.q_a_proj", no ".weight") is a target
  // of the scheme: not ignored.
  bool quantizes(std::string_view module) const;
};

// Parses the quantization_config object `v` (its key in config.json is `key`; `source` names
// the file), whose quant_method is "compressed-tensors".
Result<W8A8Quantization> parse_w8a8_quantization(std::string_view source, std::string_view key,
                                                 const nlohmann::json& v);

// The quantization_config written for W8A8 checkpoints (mkmodel --weights-int8): the scheme
// above with `ignore` as given.
nlohmann::ordered_json w8a8_quantization_json(const std::vector<std::string>& ignore);

}  // namespace xds

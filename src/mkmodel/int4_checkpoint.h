// mkmodel --weights-int4: a 4-bit round-to-nearest copy of a float DeepSeek-V3 checkpoint
// (quant/w4_rtn.h), in one of the layouts the runtime loads (model/int4_weights.h):
//
//   pack-quantized (compressed-tensors; W4A16, or W4A8 with int4_int8_activations): for a
//     quantized module <m> [rows, cols], G = int4_group_size,
//       <m>.weight_packed I32 [rows, cols/8], <m>.weight_scale [rows, cols/G] (the float
//       model's dtype), <m>.weight_shape I64 [2], asymmetric <m>.weight_zero_point I32
//       [ceil(rows/8), cols/G]
//   gptq (transformers' v1 layout, W4A16; desc_act false):
//       <m>.qweight I32 [cols/8, rows], <m>.qzeros I32 [cols/G, ceil(rows/8)] (z - 1),
//       <m>.scales F16 [cols/G, rows], <m>.g_idx I32 [cols] (c / G)
//   int4_actorder "group" (activation reordering as GPTQ / llm-compressor write it): each
//     module's columns in a seeded order (seed ^ fnv1a64(module name)), group g being the
//     columns at positions [g·G, (g+1)·G) of it, each group rounded as above; the packed q
//     stay in the checkpoint's column order and g_idx [cols] gives each column's group
//     (pack-quantized: <m>.weight_g_idx I32 [cols] and actorder "group"; gptq: <m>.g_idx
//     and desc_act true).
//
// Quantized: w8a8_rtn_target's projections and kv_b_proj whose cols are a multiple of G;
// every other tensor is copied as it is (pack-quantized lists the skipped modules in
// `ignore`; GPTQ tells them by their float `.weight`). Without from_dir the random model of
// the options is written first into a scratch directory beside out_dir (removed after).
// The copy is built in memory (the whole quantized model): for test-sized models.
#pragma once

#include "base/status.h"
#include "mkmodel/mkmodel.h"

namespace xds {

// Errors: weights_int4 not "sym"/"asym", an unsupported group size or format, gptq with int8
// activations, a source that is already quantized, a weight value that is not finite.
Status write_int4_checkpoint(const MkModelOptions& o);

}  // namespace xds

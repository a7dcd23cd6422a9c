// load_causal_lm: the one place that maps a checkpoint to the class that runs it.
//
// config.json's model_type (or, without one, its architectures list) picks a row of one
// table in registry.cc: {model_type, architecture name, loader}. A second architecture is
// one file implementing CausalLm plus one row there.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/causal_lm.h"

namespace xds {

// Loads the model in `dir`. NotFound when dir/config.json is missing; InvalidArgument naming
// the field when its model_type (architectures) is unknown, with the supported ones listed;
// else whatever the architecture's loader reports.
Result<std::unique_ptr<CausalLm>> load_causal_lm(const std::string& dir,
                                                 const ModelOptions& options);

// The facts of the model in `dir` (ModelInfo) from its config files, without loading its
// weights: what a process that does not run the model needs (the gateway's context length
// and vocabulary, the expert-parallel staging size). The same errors as load_causal_lm for
// config.json.
Result<ModelInfo> load_model_info(const std::string& dir);

// The model_type that load_causal_lm would pick for `dir` (the same errors).
Result<std::string> causal_lm_type(const std::string& dir);

// The model_type values of the table, in its order.
std::vector<std::string> supported_model_types();

}  // namespace xds

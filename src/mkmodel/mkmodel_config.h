// mkmodel's configs: the DeepseekV3Config a preset and architecture describe (mkmodel_config,
// declared in mkmodel.h) and the config.json that publishes it in that architecture's layout.
#pragma once

#include <nlohmann/json.hpp>

#include "model/deepseek_v3/config.h"

namespace xds {

// config.json of `c` with the fields its family publishes: DeepSeek-V3 and Kimi K2 as
// DeepseekV3ForCausalLM (model_type deepseek_v3 / kimi_k2, num_nextn_predict_layers),
// DeepSeek-V2 as DeepseekV2ForCausalLM (model_type deepseek_v2, no MTP field).
nlohmann::ordered_json mkmodel_config_json(const DeepseekV3Config& c);

}  // namespace xds

#include "model/registry.h"

#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/read_file.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/glm4_moe/glm4_moe.h"
#include "model/qwen3_moe/qwen3_moe.h"
#include "model/scripted_lm.h"

namespace xds {
namespace {

using Loader = Result<std::unique_ptr<CausalLm>> (*)(const std::string& dir,
                                                     const ModelOptions& options);

using InfoLoader = Result<ModelInfo> (*)(const std::string& dir);

template <typename Model>
Result<std::unique_ptr<CausalLm>> load_as(const std::string& dir, const ModelOptions& options) {
  XDS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(dir, options));
  return std::unique_ptr<CausalLm>(std::move(model));
}

struct Architecture {
  std::string_view model_type;    // config.json "model_type"
  std::string_view architecture;  // config.json "architectures" entry (Hugging Face class)
  Loader load;
  InfoLoader info;  // the ModelInfo from the config files alone (no weights)
};

// Every architecture this build runs: one row each.
constexpr Architecture kArchitectures[] = {
    {"deepseek_v3", "DeepseekV3ForCausalLM", &load_as<DeepseekV3Model>,
     &DeepseekV3Model::load_info},
    // Kimi K2 publishes the DeepSeek-V3 class under its own model_type.
    {"kimi_k2", "DeepseekV3ForCausalLM", &load_as<DeepseekV3Model>, &DeepseekV3Model::load_info},
    // DeepSeek-V2 / V2-Lite: the same MLA + DeepSeekMoE module family (deepseek_v3/config.h).
    {"deepseek_v2", "DeepseekV2ForCausalLM", &load_as<DeepseekV3Model>,
     &DeepseekV3Model::load_info},
    {"qwen3_moe", "Qwen3MoeForCausalLM", &load_as<Qwen3MoeModel>, &Qwen3MoeModel::load_info},
    {"glm4_moe", "Glm4MoeForCausalLM", &load_as<Glm4MoeModel>, &Glm4MoeModel::load_info},
    // The test model whose greedy output is a script (scripted_lm.h).
    {"xds_scripted", "XdsScriptedForCausalLM", &load_as<ScriptedLm>, &ScriptedLm::load_info},
};

std::string supported_list() {
  std::string list;
  for (const Architecture& a : kArchitectures) {
    if (!list.empty()) list += ", ";
    list += a.model_type;
  }
  return list;
}

Result<const Architecture*> find_architecture(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::exists(path)) return not_found("{}: no such file", path);
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return invalid_argument("{}: not a JSON object", path);
  if (j.contains("model_type")) {
    const nlohmann::json& t = j["model_type"];
    if (!t.is_string()) return invalid_argument("{}: field 'model_type' is not a string", path);
    const std::string type = t.get<std::string>();
    for (const Architecture& a : kArchitectures) {
      if (a.model_type == type) return &a;
    }
    return invalid_argument("{}: field 'model_type': '{}' is not supported (supported: {})", path,
                            type, supported_list());
  }
  if (j.contains("architectures") && j["architectures"].is_array()) {
    std::string seen;
    for (const nlohmann::json& name : j["architectures"]) {
      if (!name.is_string()) continue;
      for (const Architecture& a : kArchitectures) {
        if (a.architecture == name.get<std::string>()) return &a;
      }
      seen += (seen.empty() ? "" : ", ") + name.get<std::string>();
    }
    return invalid_argument(
        "{}: no field 'model_type', and field 'architectures' [{}] names none supported "
        "(supported model types: {})",
        path, seen, supported_list());
  }
  return invalid_argument("{}: field 'model_type' is missing (supported: {})", path,
                          supported_list());
}

}  // namespace

Result<std::unique_ptr<CausalLm>> load_causal_lm(const std::string& dir,
                                                 const ModelOptions& options) {
  XDS_ASSIGN_OR_RETURN(const Architecture* a, find_architecture(dir));
  return a->load(dir, options);
}

Result<ModelInfo> load_model_info(const std::string& dir) {
  XDS_ASSIGN_OR_RETURN(const Architecture* a, find_architecture(dir));
  return a->info(dir);
}

Result<std::string> causal_lm_type(const std::string& dir) {
  XDS_ASSIGN_OR_RETURN(const Architecture* a, find_architecture(dir));
  return std::string(a->model_type);
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> types;
  for (const Architecture& a : kArchitectures) types.emplace_back(a.model_type);
  return types;
}

}  // namespace xds

#include "serve/generation_config.h"

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/json_depth.h"
#include "base/read_file.h"

namespace xds::serve {

Result<SamplingDefaults> sampling_defaults_from_generation_config(std::string_view text,
                                                                  const std::string& name) {
  if (json_nesting_exceeds(text, kMaxJsonDepth)) {
    return invalid_argument("{}: JSON nested deeper than {} levels", name, kMaxJsonDepth);
  }
  const nlohmann::json g = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (g.is_discarded()) return invalid_argument("{}: invalid JSON", name);
  if (!g.is_object()) return invalid_argument("{}: expected a JSON object", name);
  SamplingDefaults d;
  auto number = [&](const char* key) -> Result<std::optional<double>> {
    const auto it = g.find(key);
    if (it == g.end() || it->is_null()) return std::optional<double>();
    if (!it->is_number() || !std::isfinite(it->get<double>())) {
      return invalid_argument("{}: field '{}': expected a number, got {}", name, key, it->dump());
    }
    return std::optional<double>(it->get<double>());
  };
  XDS_ASSIGN_OR_RETURN(const std::optional<double> temperature, number("temperature"));
  if (temperature) {
    if (*temperature < 0) {
      return invalid_argument("{}: field 'temperature': expected >= 0, got {}", name,
                              *temperature);
    }
    d.temperature = static_cast<float>(*temperature);
  }
  XDS_ASSIGN_OR_RETURN(const std::optional<double> top_p, number("top_p"));
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return invalid_argument("{}: field 'top_p': expected a number in (0, 1], got {}", name,
                              *top_p);
    }
    d.top_p = static_cast<float>(*top_p);
  }
  if (const auto it = g.find("top_k"); it != g.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      return invalid_argument("{}: field 'top_k': expected an integer, got {}", name, it->dump());
    }
    const int64_t k = it->get<int64_t>();
    d.top_k = k <= 0 ? 0 : static_cast<int32_t>(std::min<int64_t>(k, INT32_MAX));
  }
  if (const auto it = g.find("do_sample"); it != g.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return invalid_argument("{}: field 'do_sample': expected a boolean, got {}", name,
                              it->dump());
    }
    if (!it->get<bool>()) d.temperature = 0.0f;
  }
  return d;
}

Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir,
                                                std::string_view mode) {
  if (mode == "none") return SamplingDefaults{};
  if (mode != "auto") {
    return invalid_argument("--generation-config '{}' is unknown (known: auto, none)", mode);
  }
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) return SamplingDefaults{};
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path));
  return sampling_defaults_from_generation_config(text, path);
}

}  // namespace xds::serve

#include "base/env.h"

#include <array>
#include <cstdlib>
#include <stdexcept>

namespace xds::env {

namespace {

constexpr std::string_view kLogLevel = "XDS_LOG_LEVEL", kWeightLayout = "XDS_WEIGHT_LAYOUT",
                           kCacheDir = "XDS_CACHE_DIR", kCacheMaxGb = "XDS_CACHE_MAX_GB",
                           kHome = "HOME",
                           kOpenblasCoretype = "OPENBLAS_CORETYPE",
                           kEplbFailLoad = "XDS_EPLB_FAIL_LOAD";

constexpr std::array kVariables = {
    Variable{kLogLevel, "info", "log level on stderr: debug, info, warn or error"},
    Variable{kWeightLayout, "panels",
             "'rows' keeps weight matrices in the checkpoint's row layout (no repacking); "
             "otherwise they are repacked into panels"},
    Variable{kCacheDir, "$HOME/.cache/xdeepserve/repack (/tmp/xdeepserve-repack without HOME)",
             "folder of the repacked weight files"},
    Variable{kCacheMaxGb, "(no limit but the disk's)",
             "size limit of the repack folder in GB; the least recently used files are removed "
             "to stay under it and to keep 5 % of the disk free"},
    Variable{kHome, "(none)", "parent of the default repack folder"},
    Variable{kOpenblasCoretype, "(OpenBLAS's own choice)",
             "OpenBLAS kernel family; where unset, a CPU that OpenBLAS under-detects is re-run "
             "with the family its vector ISA supports"},
    Variable{kEplbFailLoad, "(none)",
             "test only: the device of this rank fails loading a replica's weights in every "
             "EPLB reconfiguration"},
};

// The variable's value, nullopt where unset.
std::optional<std::string> read(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::optional<std::string> read_non_empty(std::string_view name) {
  std::optional<std::string> v = read(name);
  if (v.has_value() && v->empty()) return std::nullopt;
  return v;
}

}  // namespace

std::span<const Variable> variables() {
  return kVariables;
}

std::string log_level() {
  return read(kLogLevel).value_or(std::string(kVariables[0].default_value));
}

std::string weight_layout() {
  return read(kWeightLayout).value_or(std::string(kVariables[1].default_value));
}

std::optional<std::string> cache_dir() {
  return read_non_empty(kCacheDir);
}

std::optional<std::string> cache_max_gb() {
  return read_non_empty(kCacheMaxGb);
}

std::optional<std::string> home() {
  return read_non_empty(kHome);
}

std::optional<std::string> openblas_coretype() {
  return read(kOpenblasCoretype);
}

bool set_openblas_coretype(const std::string& core) {
  return setenv(std::string(kOpenblasCoretype).c_str(), core.c_str(), 1) == 0;
}

void unset_openblas_coretype() {
  unsetenv(std::string(kOpenblasCoretype).c_str());
}

std::optional<int> eplb_fail_load_rank() {
  const std::optional<std::string> v = read_non_empty(kEplbFailLoad);
  if (!v) return std::nullopt;
  try {
    size_t used = 0;
    const int r = std::stoi(*v, &used);
    if (used != v->size()) return std::nullopt;
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace xds::env

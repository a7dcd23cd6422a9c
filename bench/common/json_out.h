// The benchmarks' JSON output: written whole or not at all (base/atomic_file.h).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace xds::bench {

// Writes j (indented) to path and prints "wrote <path>"; on failure prints an error naming
// the path and returns false (whatever was at path stays as it was).
bool write_json(const std::string& path, const nlohmann::json& j);

}  // namespace xds::bench

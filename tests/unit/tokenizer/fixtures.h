// Shared helpers for the tokenizer tests: fixture paths and JSON loading.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace xds::test {

inline std::string fixture_dir() { return XDS_TOKENIZER_FIXTURES; }

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline nlohmann::ordered_json read_json(const std::string& path) {
  return nlohmann::ordered_json::parse(read_text(path));
}

inline std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace xds::test

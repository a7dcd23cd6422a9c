// Shared helpers for the tokenizer tests: fixture paths and JSON loading.
#pragma once

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

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

// Loads a fixture tokenizer once per process (loading the published files takes a while
// under ASan; each CTest entry is its own process, so tests share loads where they can).
inline const Tokenizer& fixture_tokenizer(const std::string& family) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(family);
  if (it == cache.end()) {
    auto r = Tokenizer::load(fixture_dir() + "/" + family);
    XDS_CHECK(r.ok(), "{}", r.status().to_string());
    it = cache.emplace(family, std::move(r).value()).first;
  }
  return it->second;
}

}  // namespace xds::test

// Helpers for the output-process tests: tokenizer locations (relative to this file, so the
// tests need no build-time definitions) and a tokenizer cache (loading the published
// DeepSeek-V3 / Qwen3 files takes a while under ASan).
#pragma once

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "tokenizer/tokenizer.h"

namespace xds::output::test {

inline std::string source_root() { return XDS_SOURCE_DIR; }

// "kjv" (the shipped model), "deepseek_v3" or "qwen3" (tests/fixtures/tokenizer).
inline const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const std::string dir = name == "kjv" ? source_root() + "/models/kjv-moe-tiny"
                                          : source_root() + "/tests/fixtures/tokenizer/" + name;
    auto r = Tokenizer::load(dir);
    XDS_CHECK(r.ok(), "{}", r.status().to_string());
    it = cache.emplace(name, std::move(r).value()).first;
  }
  return it->second;
}

// Splits `s` into pieces at random byte offsets (pieces may be empty).
inline std::vector<std::string> random_split(std::string_view s, std::mt19937& rng, int max_piece) {
  std::vector<std::string> out;
  size_t i = 0;
  std::uniform_int_distribution<int> len(0, max_piece);
  while (i < s.size()) {
    const size_t n = std::min<size_t>(static_cast<size_t>(len(rng)), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace xds::output::test

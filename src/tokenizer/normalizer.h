// tokenizer.json "normalizer": NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Prepend, Replace
// (String or Regex pattern), Strip and Sequence of these. A null normalizer is the identity.
// Thread-safety: immutable after from_json(); apply() is const and re-entrant.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/regex.h"

namespace xds {

class Normalizer {
 public:
  // `field` is the JSON path used in errors ("normalizer", "normalizer.normalizers[1]").
  static Result<Normalizer> from_json(const nlohmann::json& j, const std::string& file,
                                      const std::string& field);

  bool is_identity() const { return steps_.empty(); }
  // `text` is valid UTF-8.
  Result<std::string> apply(std::string_view text) const;

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip };
  struct Step {
    Kind kind;
    std::string content;           // Prepend / Replace content
    std::string literal;           // Replace String pattern
    std::shared_ptr<Regex> regex;  // Replace Regex pattern
    bool strip_left = false, strip_right = false;
  };
  static Status add_steps(const nlohmann::json& j, const std::string& file,
                          const std::string& field, std::vector<Step>* steps);
  std::vector<Step> steps_;
};

}  // namespace xds

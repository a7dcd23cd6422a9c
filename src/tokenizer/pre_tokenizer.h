// tokenizer.json "pre_tokenizer": Split (Regex or String pattern; behaviours Removed, Isolated,
// MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space,
// use_regex with the GPT-2 pattern), Digits, Whitespace, WhitespaceSplit and Sequence.
// ByteLevel's byte -> character mapping itself is implicit: pieces stay raw bytes and the BPE
// model holds byte-level tokens as raw bytes.
// Thread-safety: immutable after from_json(); apply() is const and re-entrant.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/regex.h"

namespace xds {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Pure policy behind Split: `pieces` are (begin, end, is_match) ranges that tile a string in
// order; returns the ranges that remain after applying `behavior` (empty ranges dropped).
std::vector<std::pair<size_t, size_t>> apply_split_behavior(
    const std::vector<std::tuple<size_t, size_t, bool>>& pieces, SplitBehavior behavior);

class PreTokenizer {
 public:
  static Result<PreTokenizer> from_json(const nlohmann::json& j, const std::string& file,
                                        const std::string& field);

  // Splits `text` (valid UTF-8) into words. Appends to *words.
  Status apply(std::string_view text, std::vector<std::string>* words) const;
  Status apply(std::string_view text, RegexScratch* scratch, std::vector<std::string>* words) const;

  // Whether a ByteLevel step is present (the BPE vocabulary is then byte-level).
  bool byte_level() const { return byte_level_; }

 private:
  enum class Kind { kSplit, kByteLevelPrefix };
  struct Step {
    Kind kind;
    std::shared_ptr<Regex> regex;  // Split with a Regex pattern
    std::string literal;           // Split with a String pattern
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
  };
  static Status add_steps(const nlohmann::json& j, const std::string& file,
                          const std::string& field, PreTokenizer* pt);
  Status split_one(const Step& st, std::string_view s, RegexScratch* scratch,
                   std::vector<std::string>* out) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace xds

// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}).
//
// Tokens are held as the bytes they stand for: for a byte-level vocabulary ("Ġthe") the raw
// bytes (" the"), otherwise the UTF-8 token text. A word is split into initial symbols (one
// per byte when byte-level, one per character otherwise), then adjacent pairs are merged by
// rank (lowest first, leftmost among equals) until no ranked pair is left: a linked list of
// symbols plus a min-heap of candidate pairs, O(n log n) in the word length n.
// Thread-safety: immutable after from_json(); encode_word() is const and re-entrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace xds {

// Heterogeneous string hashing so lookups by string_view allocate nothing.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object; `byte_level` says whether the pre-tokenizer
  // maps bytes to the GPT-2 alphabet (then vocabulary strings are decoded to raw bytes).
  // Errors name `file` and the field ("model.merges[12]").
  static Result<BpeModel> from_json(const nlohmann::json& model, bool byte_level,
                                    const std::string& file);
  // Same, with the vocabulary and merges already pulled out of `model` (parse_tokenizer_json).
  using VocabList = std::vector<std::pair<std::string, int64_t>>;
  using MergeList = std::vector<std::pair<std::string, std::string>>;
  static Result<BpeModel> from_parts(const nlohmann::json& model, const VocabList& vocab,
                                     const MergeList& merges, bool byte_level, const std::string& file);

  // Appends the ids of one pre-tokenized word (raw bytes).
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

  // Number of ids in the vocabulary (max id + 1).
  int64_t size() const { return static_cast<int64_t>(id_to_bytes_.size()); }
  // Bytes a token stands for ("" for ids not in the vocabulary).
  const std::string& token_bytes(int32_t id) const { return id_to_bytes_[id]; }
  // Token text as written in tokenizer.json.
  const std::string& token_text(int32_t id) const { return id_to_text_[id]; }
  std::optional<int32_t> id_of_text(std::string_view text) const;
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  void initial_symbols(std::string_view word, std::vector<int32_t>* syms) const;
  void merge_small(std::vector<int32_t>* syms) const;
  void merge_heap(std::vector<int32_t>* syms) const;

  std::vector<std::string> id_to_bytes_;                 // [size] raw bytes
  std::vector<std::string> id_to_text_;                  // [size] tokenizer.json text
  StringIdMap bytes_to_id_;  // raw bytes -> id (built only when encode needs it)
  StringIdMap text_to_id_;   // tokenizer.json text -> id
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  int32_t byte_ids_[256];                       // byte-level: id of each single byte, -1 absent
  int32_t fallback_ids_[256];                   // "<0xXX>" ids when byte_fallback, -1 absent
  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
};

}  // namespace xds

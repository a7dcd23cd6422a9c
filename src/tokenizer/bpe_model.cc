#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>

#include "tokenizer/byte_level.h"
#include "tokenizer/json_field.h"
#include "tokenizer/utf8.h"

namespace xds {

namespace {
constexpr size_t kSmallWord = 24;  // below this, a quadratic scan beats the heap

// The byte of a byte-fallback token "<0xAB>": exactly two hex digits. (sscanf's %2X also
// took "<0x-1>", as 0xFFFFFFFF: an index far outside the 256-entry table.)
std::optional<uint8_t> fallback_byte(const std::string& text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text.back() != '>') return std::nullopt;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}
}  // namespace

Result<BpeModel> BpeModel::from_json(const nlohmann::json& model, bool byte_level,
                                     const std::string& file) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return invalid_argument("{}: field 'model.vocab': missing or not an object", file);
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return invalid_argument("{}: field 'model.merges': missing or not an array", file);
  }
  VocabList vocab;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) {
      return invalid_argument("{}: field 'model.vocab[\"{}\"]': expected a non-negative id, got {}", file,
                              it.key(), it.value().dump());
    }
    vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  MergeList merges;
  for (size_t i = 0; i < model["merges"].size(); ++i) {
    const auto& m = model["merges"][i];
    if (m.is_string()) {
      const std::string& ms = m.get_ref<const std::string&>();
      const size_t sp = ms.find(' ');
      if (sp == std::string::npos || ms.find(' ', sp + 1) != std::string::npos) {
        return invalid_argument("{}: field 'model.merges[{}]': expected \"left right\", got \"{}\"", file, i, ms);
      }
      merges.emplace_back(ms.substr(0, sp), ms.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return invalid_argument("{}: field 'model.merges[{}]': expected a string or a pair of strings, got {}",
                              file, i, m.dump());
    }
  }
  return from_parts(model, vocab, merges, byte_level, file);
}

Result<BpeModel> BpeModel::from_parts(const nlohmann::json& model, const VocabList& vocab,
                                      const MergeList& merges, bool byte_level, const std::string& file) {
  BpeModel bpe;
  bpe.byte_level_ = byte_level;
  std::fill(std::begin(bpe.byte_ids_), std::end(bpe.byte_ids_), -1);
  std::fill(std::begin(bpe.fallback_ids_), std::end(bpe.fallback_ids_), -1);
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(f) && model[f].is_string() && !model[f].get<std::string>().empty()) {
      return unimplemented("{}: field 'model.{}': non-empty value \"{}\" is not supported", file, f,
                           model[f].get<std::string>());
    }
  }
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0) {
    return unimplemented("{}: field 'model.dropout': BPE dropout is not supported", file);
  }
  XDS_ASSIGN_OR_RETURN(bpe.byte_fallback_,
                       json_field::field_or(model, "byte_fallback", false, file, "model"));
  XDS_ASSIGN_OR_RETURN(bpe.ignore_merges_,
                       json_field::field_or(model, "ignore_merges", false, file, "model"));

  int64_t max_id = -1;
  for (const auto& [text, id] : vocab) {
    if (id < 0 || id > INT32_MAX) {
      return invalid_argument("{}: field 'model.vocab[\"{}\"]': expected a non-negative id, got {}", file, text, id);
    }
    max_id = std::max<int64_t>(max_id, id);
  }
  // Ids index dense tables: gaps are allowed, but not more unused ids than listed tokens (plus
  // a slack), so that a small file cannot ask for gigabytes ("a": 2147483647).
  constexpr int64_t kIdGapSlack = 1024;
  if (max_id + 1 > 2 * static_cast<int64_t>(vocab.size()) + kIdGapSlack) {
    return invalid_argument(
        "{}: field 'model.vocab': ids reach {} but only {} tokens are listed "
        "(ids may leave gaps, but not more than the listed tokens plus {})",
        file, max_id, vocab.size(), kIdGapSlack);
  }
  bpe.id_to_bytes_.resize(max_id + 1);
  bpe.id_to_text_.resize(max_id + 1);
  bpe.text_to_id_.reserve(vocab.size());
  const bool need_bytes_map = !byte_level || bpe.ignore_merges_;
  if (need_bytes_map) bpe.bytes_to_id_.reserve(vocab.size());
  for (const auto& [text, id64] : vocab) {
    const auto id = static_cast<int32_t>(id64);
    bpe.id_to_text_[id] = text;
    bpe.text_to_id_.emplace(text, id);
    if (byte_level) {
      if (auto raw = byte_level::decode_token(text)) {
        if (need_bytes_map) bpe.bytes_to_id_.emplace(*raw, id);
        if (raw->size() == 1) bpe.byte_ids_[static_cast<uint8_t>((*raw)[0])] = id;
        bpe.id_to_bytes_[id] = std::move(*raw);
      } else {
        bpe.id_to_bytes_[id] = text;  // decodes as its own UTF-8, never produced by encode
      }
    } else {
      bpe.id_to_bytes_[id] = text;
      bpe.bytes_to_id_.emplace(text, id);
      if (const std::optional<uint8_t> v = fallback_byte(text)) {
        bpe.fallback_ids_[*v] = static_cast<int32_t>(id);
        bpe.id_to_bytes_[id] = std::string(1, static_cast<char>(*v));
      }
    }
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = bpe.text_to_id_.find(model["unk_token"].get<std::string>());
    if (it == bpe.text_to_id_.end()) {
      return invalid_argument("{}: field 'model.unk_token': \"{}\" is not in model.vocab", file,
                              model["unk_token"].get<std::string>());
    }
    bpe.unk_id_ = it->second;
  }

  bpe.merges_.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    auto a = bpe.text_to_id_.find(left);
    auto b = bpe.text_to_id_.find(right);
    joined.assign(left);
    joined.append(right);
    auto ab = bpe.text_to_id_.find(std::string_view(joined));
    if (a == bpe.text_to_id_.end() || b == bpe.text_to_id_.end() || ab == bpe.text_to_id_.end()) {
      return invalid_argument("{}: field 'model.merges[{}]': \"{} {}\" uses a token that is not in "
                              "model.vocab", file, i, left, right);
    }
    bpe.merges_.emplace(pair_key(a->second, b->second),
                        Merge{static_cast<int32_t>(i), ab->second});  // first occurrence wins
  }
  return bpe;
}

std::optional<int32_t> BpeModel::id_of_text(std::string_view text) const {
  auto it = text_to_id_.find(text);
  if (it == text_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>* syms) const {
  if (byte_level_) {
    for (const char c : word) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        syms->push_back(id);
      } else if (unk_id_) {
        syms->push_back(*unk_id_);
      }
    }
    return;
  }
  size_t i = 0;
  while (i < word.size()) {
    char32_t cp;
    size_t n = utf8::decode_one(word, i, &cp);
    if (n == 0) n = 1;
    auto it = bytes_to_id_.find(word.substr(i, n));
    if (it != bytes_to_id_.end()) {
      syms->push_back(it->second);
    } else if (byte_fallback_ && std::all_of(word.begin() + i, word.begin() + i + n, [&](char c) {
                 return fallback_ids_[static_cast<uint8_t>(c)] >= 0;
               })) {
      for (size_t k = 0; k < n; ++k) syms->push_back(fallback_ids_[static_cast<uint8_t>(word[i + k])]);
    } else if (unk_id_) {
      syms->push_back(*unk_id_);
    }
    i += n;
  }
}

void BpeModel::merge_small(std::vector<int32_t>* syms) const {
  auto& s = *syms;
  while (s.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Merge* m = find_merge(s[i], s[i + 1]);
      if (m != nullptr && m->rank < best_rank) {
        best_rank = m->rank;
        best_id = m->id;
        best_pos = i;
      }
    }
    if (best_id < 0) break;
    s[best_pos] = best_id;
    s.erase(s.begin() + best_pos + 1);
  }
}

void BpeModel::merge_heap(std::vector<int32_t>* syms) const {
  auto& s = *syms;
  const size_t n = s.size();
  std::vector<int32_t> prev(n), next(n);  // [n] linked list over positions; -1 = none
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank, pos, left, right;  // pos = left symbol position; left/right ids at push time
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t p) {
    if (p < 0 || next[p] < 0) return;
    if (const Merge* m = find_merge(s[p], s[next[p]])) heap.push({m->rank, p, s[p], s[next[p]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int32_t r = next[c.pos];
    if (!alive[c.pos] || r < 0 || s[c.pos] != c.left || s[r] != c.right) continue;  // stale
    s[c.pos] = find_merge(c.left, c.right)->id;
    alive[r] = 0;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t p = 0; p >= 0; p = next[p]) s[w++] = s[p];
  s.resize(w);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(word);
    if (it != bytes_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  initial_symbols(word, &syms);
  if (syms.size() <= kSmallWord) {
    merge_small(&syms);
  } else {
    merge_heap(&syms);
  }
  out->insert(out->end(), syms.begin(), syms.end());
}

}  // namespace xds

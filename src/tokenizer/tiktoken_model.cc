#include "tokenizer/tiktoken_model.h"

#include <charconv>
#include <limits>

namespace xds {

const char kKimiSplitPattern[] =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

namespace {

constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::optional<std::string> base64_decode(std::string_view s) {
  if (s.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    int pad = 0;
    if (last && s[i + 3] == '=') pad = s[i + 2] == '=' ? 2 : 1;
    uint32_t group = 0;
    for (int k = 0; k < 4; ++k) {
      int v = 0;
      if (k < 4 - pad) {
        v = base64_value(s[i + k]);
        if (v < 0) return std::nullopt;
      }
      group = (group << 6) | static_cast<uint32_t>(v);
    }
    out.push_back(static_cast<char>(group >> 16));
    if (pad < 2) out.push_back(static_cast<char>((group >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(group & 0xff));
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t k = 0; k < 3; ++k) {
      group = (group << 8) | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0u);
    }
    for (size_t k = 0; k < 4; ++k) {
      out.push_back(k <= n ? kBase64Alphabet[(group >> (18 - 6 * k)) & 63] : '=');
    }
  }
  return out;
}

Result<TiktokenModel> TiktokenModel::parse(std::string_view text, const std::string& name) {
  struct Entry {
    std::string bytes;
    int64_t rank;
    size_t line;
  };
  std::vector<Entry> entries;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      if (pos >= text.size()) break;  // a trailing newline
      return invalid_argument("{}: line {}: empty line", name, line_no);
    }
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
      return invalid_argument("{}: line {}: expected \"BASE64 RANK\", got \"{}\"", name, line_no,
                              line.substr(0, 80));
    }
    auto bytes = base64_decode(line.substr(0, sp));
    if (!bytes || bytes->empty()) {
      return invalid_argument("{}: line {}: \"{}\" is not base64 of a non-empty token", name,
                              line_no, line.substr(0, std::min<size_t>(sp, 80)));
    }
    const std::string_view rank_text = line.substr(sp + 1);
    int64_t rank = -1;
    const auto [end, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0) {
      return invalid_argument("{}: line {}: rank \"{}\" is not an integer >= 0", name, line_no,
                              rank_text.substr(0, 40));
    }
    entries.push_back({std::move(*bytes), rank, line_no});
  }
  const int64_t n = static_cast<int64_t>(entries.size());
  if (n == 0) return invalid_argument("{}: no tokens", name);
  if (n > std::numeric_limits<int32_t>::max() - kKimiNumSpecialTokens) {
    return invalid_argument("{}: {} tokens is more than ids can hold", name, n);
  }
  TiktokenModel m;
  m.id_to_bytes_.resize(static_cast<size_t>(n));
  std::vector<uint8_t> seen(static_cast<size_t>(n), 0);
  m.bytes_to_id_.reserve(static_cast<size_t>(n));
  for (Entry& e : entries) {
    if (e.rank >= n) {
      return invalid_argument("{}: line {}: rank {} is not below the number of tokens {} (ranks "
                              "must be 0..{} without gaps)", name, e.line, e.rank, n, n - 1);
    }
    if (seen[e.rank]) {
      return invalid_argument("{}: line {}: rank {} appears twice", name, e.line, e.rank);
    }
    seen[e.rank] = 1;
    if (!m.bytes_to_id_.emplace(e.bytes, static_cast<int32_t>(e.rank)).second) {
      return invalid_argument("{}: line {}: token {} appears twice", name, e.line,
                              base64_encode(e.bytes));
    }
    m.id_to_bytes_[e.rank] = std::move(e.bytes);
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (!m.bytes_to_id_.contains(std::string_view(&c, 1))) {
      return invalid_argument("{}: byte 0x{:02x} is not a token (every single byte must be)", name,
                              b);
    }
  }
  return m;
}

std::optional<int32_t> TiktokenModel::id_of_bytes(std::string_view bytes) const {
  auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

void TiktokenModel::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (auto whole = id_of_bytes(word)) {
    out->push_back(*whole);
    return;
  }
  // bounds[k] is where the k-th part starts (the last entry is word.size()); rank[k] is the
  // rank of parts k and k+1 concatenated (kNone when that is not a token or k+1 is the end).
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  std::vector<size_t> bounds(word.size() + 1);
  for (size_t i = 0; i <= word.size(); ++i) bounds[i] = i;
  auto pair_rank = [&](size_t k) -> int32_t {
    if (k + 2 >= bounds.size()) return kNone;
    auto id = id_of_bytes(word.substr(bounds[k], bounds[k + 2] - bounds[k]));
    return id ? *id : kNone;
  };
  std::vector<int32_t> rank(bounds.size());
  for (size_t k = 0; k < rank.size(); ++k) rank[k] = pair_rank(k);
  while (true) {
    size_t best = 0;
    int32_t best_rank = kNone;
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      if (rank[k] < best_rank) {
        best_rank = rank[k];
        best = k;
      }
    }
    if (best_rank == kNone) break;
    bounds.erase(bounds.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    rank[best] = pair_rank(best);
    if (best > 0) rank[best - 1] = pair_rank(best - 1);
  }
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    // Every part is a token: single bytes always are, merged parts were looked up.
    out->push_back(*id_of_bytes(word.substr(bounds[k], bounds[k + 1] - bounds[k])));
  }
}

}  // namespace xds

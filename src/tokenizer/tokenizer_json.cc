#include "tokenizer/tokenizer_json.h"

#include "base/json_depth.h"

namespace xds {
namespace {

using json = nlohmann::json;

class Sax {
 public:
  explicit Sax(TokenizerJson* out) : out_(out) {}

  bool null() { return value(json(nullptr)); }
  bool boolean(bool v) { return value(json(v)); }
  bool number_integer(json::number_integer_t v) { return mode_ == Mode::kVocab ? vocab_id(v) : value(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) {
    return mode_ == Mode::kVocab ? vocab_id(static_cast<int64_t>(v)) : value(json(v));
  }
  bool number_float(json::number_float_t v, const std::string&) { return value(json(v)); }
  bool binary(json::binary_t&) { return fail("binary values are not JSON"); }
  bool string(std::string& s) {
    if (mode_ == Mode::kMerges) {
      if (pair_depth_ == 0) return merge_string(s);
      pair_.push_back(std::move(s));
      return true;
    }
    return value(json(std::move(s)));
  }

  bool start_object(size_t) {
    if (mode_ != Mode::kNormal) return fail(where() + ": unexpected object");
    if (stack_.size() == 2 && key_ == "vocab" && in_model()) {
      out_->has_vocab = true;
      (*stack_.back())[key_] = json::object();
      mode_ = Mode::kVocab;
      return true;
    }
    return open(json::object());
  }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kNormal;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(size_t) {
    if (mode_ == Mode::kVocab) return fail(fmt::format("field 'model.vocab[\"{}\"]': expected an id", key_));
    if (mode_ == Mode::kMerges) {
      if (pair_depth_ > 0) return fail(fmt::format("field 'model.merges[{}]': nested arrays", out_->merges.size()));
      pair_depth_ = 1;
      pair_.clear();
      return true;
    }
    if (stack_.size() == 2 && key_ == "merges" && in_model()) {
      out_->has_merges = true;
      (*stack_.back())[key_] = json::array();
      mode_ = Mode::kMerges;
      return true;
    }
    return open(json::array());
  }
  bool end_array() {
    if (mode_ == Mode::kMerges) {
      if (pair_depth_ == 0) {
        mode_ = Mode::kNormal;
        return true;
      }
      pair_depth_ = 0;
      if (pair_.size() != 2) {
        return fail(fmt::format("field 'model.merges[{}]': expected a pair of strings", out_->merges.size()));
      }
      out_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    return fail(fmt::format("invalid JSON: {}", e.what()));
  }

  const std::string& error() const { return error_; }

 private:
  enum class Mode { kNormal, kVocab, kMerges };

  bool in_model() const { return keys_.size() == 2 && keys_[1] == "model"; }
  std::string where() const { return mode_ == Mode::kVocab ? "field 'model.vocab'" : "field 'model.merges'"; }

  bool fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }
  bool vocab_id(int64_t v) {
    if (v < 0 || v > INT32_MAX) return fail(fmt::format("field 'model.vocab[\"{}\"]': expected a non-negative id, got {}", key_, v));
    out_->vocab.emplace_back(std::move(key_), v);
    return true;
  }
  bool merge_string(std::string& s) {
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
      return fail(fmt::format("field 'model.merges[{}]': expected \"left right\", got \"{}\"", out_->merges.size(), s));
    }
    out_->merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    return true;
  }
  bool value(json v) {
    if (mode_ == Mode::kVocab) return fail(fmt::format("field 'model.vocab[\"{}\"]': expected an id, got {}", key_, v.dump()));
    if (mode_ == Mode::kMerges) return fail(fmt::format("field 'model.merges[{}]': expected a string or a pair", out_->merges.size()));
    if (stack_.empty()) {
      out_->root = std::move(v);
    } else if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
    } else {
      (*stack_.back())[key_] = std::move(v);
    }
    return true;
  }
  bool open(json v) {
    json* slot;
    std::string k = stack_.empty() ? "" : key_;
    if (stack_.empty()) {
      out_->root = std::move(v);
      slot = &out_->root;
    } else if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
      slot = &stack_.back()->back();
    } else {
      slot = &((*stack_.back())[key_] = std::move(v));
    }
    stack_.push_back(slot);
    keys_.push_back(std::move(k));
    return true;
  }

  TokenizerJson* out_;
  std::vector<json*> stack_;       // open containers, root first
  std::vector<std::string> keys_;  // key under which each open container sits ("" for root)
  std::string key_;
  Mode mode_ = Mode::kNormal;
  int pair_depth_ = 0;
  std::vector<std::string> pair_;
  std::string error_;
};

}  // namespace

Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& name) {
  // The tree of the small parts is copied and printed recursively (base/json_depth.h).
  if (json_nesting_exceeds(text, kMaxJsonDepth)) {
    return invalid_argument("{}: JSON nested deeper than {} levels", name, kMaxJsonDepth);
  }
  TokenizerJson out;
  Sax sax(&out);
  const bool ok = json::sax_parse(text.begin(), text.end(), &sax);
  if (!ok) return invalid_argument("{}: {}", name, sax.error().empty() ? "invalid JSON" : sax.error());
  return out;
}

}  // namespace xds

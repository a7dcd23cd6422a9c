#include "model/scripted_lm.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/read_file.h"
#include "model/config_json.h"

namespace xds {
namespace {

using json = nlohmann::json;
using Config = ScriptedLmConfig;
using config_json::field_error;
using config_json::get_int;

constexpr std::string_view kModelType = "xds_scripted";
constexpr int64_t kMaxVocab = int64_t{1} << 20;        // logit rows stay small
constexpr int64_t kMaxScript = int64_t{1} << 20;       // script ids
constexpr int64_t kMaxPositions = int64_t{INT32_MAX};  // positions index int32 block tables

// Whether `v` is a token id: an integer in [0, INT32_MAX] (a list entry; the list's message
// names the field).
bool is_token_id(const json& v) {
  if (!v.is_number_integer()) return false;
  const int64_t i = v.get<int64_t>();  // unsigned beyond INT64_MAX wraps negative: refused
  return i >= 0 && i <= INT32_MAX;
}

// Parsers of one key (present, possibly null) into the config.
using FieldParser = Status (*)(std::string_view source, std::string_view key, const json& v,
                               Config& c);

Status parse_model_type(std::string_view source, std::string_view key, const json& v, Config&) {
  if (!v.is_string() || v.get<std::string>() != kModelType) {
    return field_error(source, key, "\"xds_scripted\"", v);
  }
  return {};
}

Status parse_vocab(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(c.vocab_size, get_int(source, key, v, 1, kMaxVocab));
  return {};
}

Status parse_positions(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(c.max_position_embeddings, get_int(source, key, v, 1, kMaxPositions));
  return {};
}

Status parse_script(std::string_view source, std::string_view key, const json& v, Config& c) {
  const std::string what = fmt::format("a non-empty list of at most {} ids >= 0", kMaxScript);
  if (!v.is_array() || v.empty() || static_cast<int64_t>(v.size()) > kMaxScript) {
    return field_error(source, key, what, v);
  }
  c.script.clear();
  for (const json& e : v) {
    if (!is_token_id(e)) return field_error(source, key, what, v);
    c.script.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return {};
}

Status parse_eos(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(c.eos_token_ids, config_json::get_token_ids(source, key, v));
  return {};
}

Status parse_bos(std::string_view source, std::string_view key, const json& v, Config& c) {
  c.bos_token_id.reset();
  if (v.is_null()) return {};
  XDS_ASSIGN_OR_RETURN(c.bos_token_id, get_int(source, key, v, 0, INT32_MAX));
  return {};
}

struct FieldSpec {
  std::string_view key;  // the Hugging Face config.json key
  bool required;
  FieldParser parse;
};

// Every config.json key the model reads, once.
constexpr FieldSpec kFields[] = {
    {"model_type", true, parse_model_type},
    {"vocab_size", true, parse_vocab},
    {"max_position_embeddings", true, parse_positions},
    {"script_token_ids", true, parse_script},
    {"eos_token_id", false, parse_eos},
    {"bos_token_id", false, parse_bos},
};

// Every id below vocab_size; `source` names the file that set them.
Status check_ids(std::string_view source, const Config& c) {
  for (size_t i = 0; i < c.script.size(); ++i) {
    if (c.script[i] >= c.vocab_size) {
      return invalid_argument(
          "{}: field 'script_token_ids': entry {} is id {}, not below vocab_size ({})", source, i,
          c.script[i], c.vocab_size);
    }
  }
  for (int64_t id : c.eos_token_ids) {
    if (id >= c.vocab_size) {
      return invalid_argument("{}: field 'eos_token_id': id {} is not below vocab_size ({})",
                              source, id, c.vocab_size);
    }
  }
  if (c.bos_token_id && *c.bos_token_id >= c.vocab_size) {
    return invalid_argument("{}: field 'bos_token_id': id {} is not below vocab_size ({})", source,
                            *c.bos_token_id, c.vocab_size);
  }
  return {};
}

ModelInfo make_info(const Config& c, const std::string& name) {
  ModelInfo info;
  info.model_type = std::string(kModelType);
  info.name = name;
  info.vocab_size = c.vocab_size;
  info.hidden_size = 0;  // StepOutput::hidden stays empty
  info.num_layers = 1;   // the one cache layer of token ids
  info.max_position_embeddings = c.max_position_embeddings;
  info.eos_token_ids = c.eos_token_ids;
  info.bos_token_id = c.bos_token_id;
  return info;
}

// The row of position `pos` of a sequence with block table `blocks`: one int32.
std::byte* token_row(KvStorage& kv, std::span<const int32_t> blocks, int64_t pos) {
  const int64_t bs = kv.block_size();
  return kv.plane_ptr(blocks[static_cast<size_t>(pos / bs)], 0, 0) + (pos % bs) * 4;
}

}  // namespace

Result<ScriptedLmConfig> parse_scripted_lm_config(const std::string& json_text,
                                                  const std::string& source) {
  XDS_ASSIGN_OR_RETURN(const json j, config_json::parse_object(json_text, source));
  Config c;
  for (const FieldSpec& f : kFields) {
    const auto it = j.find(f.key);
    if (it == j.end()) {
      if (f.required)
        return invalid_argument("{}: field '{}': required but missing", source, f.key);
      continue;
    }
    XDS_RETURN_IF_ERROR(f.parse(source, f.key, *it, c));
  }
  XDS_RETURN_IF_ERROR(check_ids(source, c));
  return c;
}

Result<ScriptedLmConfig> load_scripted_lm_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path));
  XDS_ASSIGN_OR_RETURN(Config c, parse_scripted_lm_config(text, path));
  XDS_ASSIGN_OR_RETURN(const std::string gen_path,
                       config_json::apply_generation_config(dir, c.eos_token_ids, c.bos_token_id));
  if (gen_path.empty()) return c;
  XDS_RETURN_IF_ERROR(check_ids(gen_path, c));
  return c;
}

ScriptedLm::ScriptedLm(const ScriptedLmConfig& config) : config_(config) {
  // The KMP failure table of the script.
  const std::vector<int32_t>& s = config_.script;
  fail_.assign(s.size(), 0);
  int32_t k = 0;
  for (size_t i = 1; i < s.size(); ++i) {
    while (k > 0 && s[i] != s[static_cast<size_t>(k)]) k = fail_[static_cast<size_t>(k - 1)];
    if (s[i] == s[static_cast<size_t>(k)]) ++k;
    fail_[i] = k;
  }
}

Result<std::unique_ptr<ScriptedLm>> ScriptedLm::create(const ScriptedLmConfig& config,
                                                       const std::string& name) {
  if (config.vocab_size < 1 || config.vocab_size > kMaxVocab ||
      config.max_position_embeddings < 1 || config.script.empty()) {
    return invalid_argument(
        "scripted model '{}': vocab_size {} must be in [1, {}], max_position_embeddings {} >= 1, "
        "and the script ({} ids) not empty",
        name, config.vocab_size, kMaxVocab, config.max_position_embeddings, config.script.size());
  }
  for (int32_t id : config.script) {
    if (id < 0) return invalid_argument("scripted model '{}': script id {} < 0", name, id);
  }
  XDS_RETURN_IF_ERROR(check_ids(fmt::format("scripted model '{}'", name), config));
  std::unique_ptr<ScriptedLm> m(new ScriptedLm(config));
  m->info_ = make_info(config, name);
  return m;
}

Result<std::unique_ptr<ScriptedLm>> ScriptedLm::load(const std::string& dir,
                                                     const ModelOptions& options) {
  XDS_ASSIGN_OR_RETURN(const Config c, load_scripted_lm_config(dir));
  XDS_ASSIGN_OR_RETURN(std::unique_ptr<ScriptedLm> m, create(c, config_json::checkpoint_name(dir)));
  m->compute_ = options.compute;
  return m;
}

Result<ModelInfo> ScriptedLm::load_info(const std::string& dir) {
  XDS_ASSIGN_OR_RETURN(const Config c, load_scripted_lm_config(dir));
  return make_info(c, config_json::checkpoint_name(dir));
}

KvLayout ScriptedLm::kv_layout() const {
  KvLayout l;
  l.layers = 1;
  l.planes.push_back({DType::kI32, 1, 4});  // [1] the token id at the position
  return l;
}

int64_t ScriptedLm::state_after(std::span<const int32_t> context) const {
  const std::vector<int32_t>& s = config_.script;
  const int64_t n = static_cast<int64_t>(s.size());
  // Only the last S ids can hold a suffix that is a prefix of the script.
  if (static_cast<int64_t>(context.size()) > n) context = context.last(static_cast<size_t>(n));
  int64_t k = 0;
  for (const int32_t id : context) {
    while (k > 0 && (k == n || s[static_cast<size_t>(k)] != id)) {
      k = fail_[static_cast<size_t>(k - 1)];
    }
    if (k < n && s[static_cast<size_t>(k)] == id) ++k;
  }
  return k;
}

int32_t ScriptedLm::next_token(std::span<const int32_t> context) const {
  const int64_t k = state_after(context);
  const std::vector<int32_t>& s = config_.script;
  if (k < static_cast<int64_t>(s.size())) return s[static_cast<size_t>(k)];
  return config_.eos_token_ids.empty() ? s[0] : static_cast<int32_t>(config_.eos_token_ids[0]);
}

Status ScriptedLm::check_storage(const KvStorage& kv) const {
  const KvLayout want = kv_layout();
  const KvLayout& have = kv.layout();
  const KvPlane& w = want.planes[0];
  if (have.layers < want.layers || have.planes.size() != 1 || have.planes[0].dtype != w.dtype ||
      have.planes[0].elements != w.elements || have.planes[0].row_bytes != w.row_bytes) {
    return invalid_argument(
        "KV storage of {} layers x {} planes does not fit the scripted model: 1 layer of one "
        "plane of 1 I32 (the token id) per row",
        have.layers, have.planes.size());
  }
  return {};
}

Status ScriptedLm::check_chunk(size_t index, const TokenChunk& chunk, const KvStorage& kv) const {
  for (size_t i = 0; i < chunk.tokens.size(); ++i) {
    if (chunk.tokens[i] < 0 || chunk.tokens[i] >= config_.vocab_size) {
      return invalid_argument("chunk {}: token {} is id {}, out of range [0, {})", index, i,
                              chunk.tokens[i], config_.vocab_size);
    }
  }
  if (chunk.start_pos < 0) {
    return invalid_argument("chunk {}: start position {} < 0", index, chunk.start_pos);
  }
  const int64_t end = chunk.start_pos + static_cast<int64_t>(chunk.tokens.size());
  const int64_t bs = kv.block_size();
  const int64_t need = (end + bs - 1) / bs;
  if (static_cast<int64_t>(chunk.blocks.size()) < need) {
    return invalid_argument(
        "chunk {}: positions [{}, {}) need {} blocks of {} rows, its block table has {}", index,
        chunk.start_pos, end, need, bs, chunk.blocks.size());
  }
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = chunk.blocks[static_cast<size_t>(i)];
    if (b < 0 || b >= kv.num_blocks()) {
      return invalid_argument("chunk {}: block table entry {} is block {}, outside [0, {})", index,
                              i, b, kv.num_blocks());
    }
  }
  return {};
}

Status ScriptedLm::forward(std::span<const TokenChunk> chunks, KvStorage& kv, StepOutput& out) {
  XDS_RETURN_IF_ERROR(check_storage(kv));
  for (size_t i = 0; i < chunks.size(); ++i) XDS_RETURN_IF_ERROR(check_chunk(i, chunks[i], kv));
  // Every chunk's rows first: a logit row reads only positions its own step has written or
  // an earlier step did.
  for (const TokenChunk& ch : chunks) {
    for (size_t t = 0; t < ch.tokens.size(); ++t) {
      std::memcpy(token_row(kv, ch.blocks, ch.start_pos + static_cast<int64_t>(t)), &ch.tokens[t],
                  sizeof(int32_t));
    }
  }
  out.logit_tokens.clear();
  out.hidden.clear();             // hidden_size 0
  std::vector<int64_t> row_pos;   // [rows] position of each logit row
  std::vector<size_t> row_chunk;  // [rows] its chunk
  int64_t at = 0;                 // batch index of the chunk's first token
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t count = static_cast<int64_t>(chunks[i].tokens.size());
    for (int64_t t = chunks[i].all_logits ? 0 : count - 1; t >= 0 && t < count; ++t) {
      out.logit_tokens.push_back(at + t);
      row_pos.push_back(chunks[i].start_pos + t);
      row_chunk.push_back(i);
    }
    at += count;
  }
  const int64_t v = config_.vocab_size;
  const int64_t script = static_cast<int64_t>(config_.script.size());
  out.logits.assign(out.logit_tokens.size() * static_cast<size_t>(v), 0.0f);  // [rows, vocab]
  for (size_t r = 0; r < out.logit_tokens.size(); ++r) {
    // The context window [first, pos]: the last S positions are all the rule looks at.
    const int64_t pos = row_pos[r], first = std::max<int64_t>(0, pos + 1 - script);
    s_context_.resize(static_cast<size_t>(pos + 1 - first));
    for (int64_t p = first; p <= pos; ++p) {
      std::memcpy(&s_context_[static_cast<size_t>(p - first)],
                  token_row(kv, chunks[row_chunk[r]].blocks, p), sizeof(int32_t));
    }
    const int32_t id = next_token(s_context_);
    out.logits[r * static_cast<size_t>(v) + static_cast<size_t>(id)] = kScriptedLogit;
  }
  return {};
}

Status ScriptedLm::forward_mtp(int64_t k, std::span<const MtpChunk>, KvStorage&, StepOutput&) {
  return invalid_argument("MTP layer {} requested, the scripted model has 0", k);
}

}  // namespace xds

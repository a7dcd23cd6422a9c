#include "tokenizer/kimi_synthetic.h"

#include <filesystem>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "tokenizer/tiktoken_model.h"

namespace xds {
namespace {

uint64_t splitmix64(uint64_t* state) {
  uint64_t x = (*state += 0x9e3779b97f4a7c15ULL);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Offsets from the first special id, as Kimi K2's tokenizer_config.json names them.
struct NamedSpecial {
  int offset;
  const char* content;
};
constexpr NamedSpecial kKimiSpecials[] = {
    {0, "[BOS]"},
    {1, "[EOS]"},
    {2, "<|im_end|>"},
    {3, "<|im_user|>"},
    {4, "<|im_assistant|>"},
    {6, "<|start_header_id|>"},
    {7, "<|end_header_id|>"},
    {9, "[EOT]"},
    {10, "<|im_system|>"},
    {11, "<|tool_calls_section_begin|>"},
    {12, "<|tool_calls_section_end|>"},
    {13, "<|tool_call_begin|>"},
    {14, "<|tool_call_argument_begin|>"},
    {15, "<|tool_call_end|>"},
    {17, "<|im_middle|>"},
    {18, "<|media_begin|>"},
    {19, "<|media_content|>"},
    {20, "<|media_end|>"},
    {21, "<|media_pad|>"},
    {22, "<think>"},
    {23, "</think>"},
    {254, "[UNK]"},
    {255, "[PAD]"},
};

// Kimi K2's turn format, written for the synthetic model (not the published template text).
constexpr const char* kSyntheticChatTemplate =
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if loop.first and m['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>{%- endif -%}"
    "{%- if m['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- elif m['role'] == 'tool' -%}<|im_system|>tool<|im_middle|>"
    "{%- else -%}<|im_system|>{{ m['role'] }}<|im_middle|>{%- endif -%}"
    "{%- if m['content'] is string -%}{{ m['content'] }}{%- endif -%}"
    "{%- if m.get('tool_calls') -%}<|tool_calls_section_begin|>"
    "{%- for c in m['tool_calls'] -%}<|tool_call_begin|>{{ c['id'] }}<|tool_call_argument_begin|>"
    "{%- if c['function']['arguments'] is string -%}{{ c['function']['arguments'] }}"
    "{%- else -%}{{ c['function']['arguments'] | tojson }}{%- endif -%}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}";

// Bytes that ordinary text is made of (letters, digits, space, punctuation, a CJK lead byte
// and continuation bytes), drawn more often than the rest so that merges look like text.
constexpr std::string_view kTextBytes =
    " etaoinshrdlucmfwypvbgkjqxzETAOINS0123456789.,:;'\"()-_\n\xe4\xb8\xad\x80\xbd\xa0";

std::string synthetic_tiktoken_model(int64_t num_tokens, uint64_t seed) {
  std::vector<std::string> tokens;
  tokens.reserve(static_cast<size_t>(num_tokens));
  std::unordered_set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    seen.insert(tokens.back());
  }
  uint64_t state = seed ^ 0x4b696d694b32ULL;  // "KimiK2"
  auto pick = [&]() -> const std::string& {
    const uint64_t r = splitmix64(&state);
    if ((r & 3) == 0) {
      return tokens[static_cast<uint8_t>(kTextBytes[(r >> 2) % kTextBytes.size()])];
    }
    // Recent tokens more often than old ones: build on what was just made.
    const size_t n = tokens.size();
    const size_t window = std::min<size_t>(n, 4096);
    return (r & 4) ? tokens[n - 1 - (r >> 8) % window] : tokens[(r >> 8) % n];
  };
  while (static_cast<int64_t>(tokens.size()) < num_tokens) {
    std::string joined = pick();
    joined += pick();
    if (joined.size() > 16 || seen.contains(joined)) continue;
    seen.insert(joined);
    tokens.push_back(std::move(joined));
  }
  std::string out;
  out.reserve(tokens.size() * 16);
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    out += base64_encode(tokens[rank]);
    out += fmt::format(" {}\n", rank);
  }
  return out;
}

nlohmann::ordered_json synthetic_config(int64_t vocab_size) {
  const int64_t first = vocab_size - 256;
  std::vector<std::string> names(256);
  for (int k = 0; k < 256; ++k) names[k] = fmt::format("<|reserved_token_{}|>", first + k);
  for (const NamedSpecial& s : kKimiSpecials) names[s.offset] = s.content;
  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  for (int k = 0; k < 256; ++k) {
    decoder[std::to_string(first + k)] = {{"content", names[k]}, {"lstrip", false},
                                          {"normalized", false}, {"rstrip", false},
                                          {"single_word", false}, {"special", true}};
  }
  nlohmann::ordered_json cfg;
  cfg["added_tokens_decoder"] = std::move(decoder);
  cfg["additional_special_tokens"] = {"<|im_end|>",        "<|im_user|>",       "<|im_assistant|>",
                                      "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                      "<|im_system|>",     "<|im_middle|>"};
  cfg["bos_token"] = "[BOS]";
  cfg["chat_template"] = kSyntheticChatTemplate;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = "[EOS]";
  cfg["extra_special_tokens"] = nlohmann::ordered_json::object();
  cfg["model_max_length"] = 1000000000000000019884624838656.0;
  cfg["pad_token"] = "[PAD]";
  cfg["tokenizer_class"] = "TikTokenTokenizer";
  cfg["unk_token"] = "[UNK]";
  cfg["auto_map"] = {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}};
  return cfg;
}

Status write_file(const std::string& path, std::string_view text) {
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(text));
  return f.commit();
}

}  // namespace

Status write_kimi_synthetic_tokenizer(const std::string& out_dir, int64_t vocab_size,
                                      uint64_t seed) {
  if (vocab_size < 1024 || vocab_size > (int64_t{1} << 30)) {
    return invalid_argument("Kimi K2 synthetic tokenizer: vocab_size {} is outside [1024, 2^30]",
                            vocab_size);
  }
  const std::filesystem::path dir(out_dir);
  XDS_RETURN_IF_ERROR(write_file((dir / "tiktoken.model").string(),
                                 synthetic_tiktoken_model(vocab_size - 256, seed)));
  return write_file((dir / "tokenizer_config.json").string(),
                    synthetic_config(vocab_size).dump(2) + "\n");
}

}  // namespace xds

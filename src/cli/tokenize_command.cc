// `xdeepserve tokenize`: text -> token ids (JSON array) with the model's tokenizer, optionally
// through its chat template; --decode ids -> text.
//
//   xdeepserve tokenize --model DIR --text TEXT [--chat] [--no-special]
//   xdeepserve tokenize --model DIR --file F [--chat] [--chat-template FILE]
//   xdeepserve tokenize --model DIR --messages M.json [--render]   (M: [..] or {"messages", "tools"})
//   xdeepserve tokenize --model DIR --decode 1,2,3 [--skip-special]
//
// --text/--file alone are the operator's text: special tokens in them are matched. Through the
// chat template (--chat, --messages) the message content is untrusted, as serve treats it
// (docs/design/tokenizer.md, "Untrusted text").
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/read_file.h"
#include "cli/commands.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace xds::cli {
namespace {

struct TokenizeArgs {
  std::string model, text, file, messages, decode, chat_template;
  bool chat = false, no_special = false, skip_special = false, render = false;
};

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" []\t\n");
    const size_t e = item.find_last_not_of(" []\t\n");
    if (b == std::string::npos) continue;
    const std::string t = item.substr(b, e - b + 1);
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (end == t.c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return invalid_argument("--decode: '{}' is not a token id", t);
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

Status run_tokenize(const TokenizeArgs& a) {
  XDS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.model));
  if (!a.decode.empty()) {
    XDS_ASSIGN_OR_RETURN(auto ids, parse_ids(a.decode));
    for (const int32_t id : ids) {
      if (id >= tok.vocab_size()) {
        return invalid_argument("--decode: id {} is outside the vocabulary (size {})", id, tok.vocab_size());
      }
    }
    const std::string text = tok.decode(ids, a.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return {};
  }
  std::vector<int32_t> ids;
  if (a.chat || !a.messages.empty()) {
    XDS_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::load(a.model, a.chat_template));
    nlohmann::ordered_json messages, tools;
    if (!a.messages.empty()) {
      XDS_ASSIGN_OR_RETURN(std::string m, read_whole_file(a.messages));
      try {
        auto j = nlohmann::ordered_json::parse(m);
        if (j.is_object()) {
          messages = j.value("messages", nlohmann::ordered_json::array());
          if (j.contains("tools")) tools = j["tools"];
        } else {
          messages = j;
        }
      } catch (const nlohmann::json::parse_error& e) {
        return invalid_argument("{}: invalid JSON: {}", a.messages, e.what());
      }
    } else {
      std::string text = a.text;
      if (!a.file.empty()) {
        XDS_ASSIGN_OR_RETURN(text, read_whole_file(a.file));
      }
      messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}});
    }
    if (a.render) {
      XDS_ASSIGN_OR_RETURN(std::string prompt, tmpl.render_ordered(messages, true, tools));
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fputc('\n', stdout);
      return {};
    }
    // Messages and tools are untrusted, as serve treats them by default: the ids equal serve's.
    XDS_ASSIGN_OR_RETURN(ids, encode_chat_ordered(tok, tmpl, messages, /*add_generation_prompt=*/true,
                                                  tools, MessageTrust::kUntrusted));
  } else {
    std::string text = a.text;
    if (!a.file.empty()) {
      XDS_ASSIGN_OR_RETURN(text, read_whole_file(a.file));
      auto r = tok.encode(text, !a.no_special);
      if (!r.ok()) return r.status().with_context(a.file);
      ids = std::move(r).value();
    } else {
      XDS_ASSIGN_OR_RETURN(ids, tok.encode(text, !a.no_special));
    }
  }
  const std::string out = nlohmann::json(ids).dump();
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
  return {};
}

}  // namespace

void add_tokenize_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array (or --decode ids)");
  cmd->add_option("--model", args->model, "Model directory with tokenizer.json")->required();
  auto* text = cmd->add_option("--text", args->text, "Text to tokenize");
  auto* file = cmd->add_option("--file", args->file, "File whose contents to tokenize");
  auto* msgs = cmd->add_option("--messages", args->messages, "JSON file: messages array or {messages, tools}");
  auto* dec = cmd->add_option("--decode", args->decode, "Comma-separated ids to decode to text");
  text->excludes(file)->excludes(msgs)->excludes(dec);
  file->excludes(msgs)->excludes(dec);
  msgs->excludes(dec);
  cmd->add_flag("--chat", args->chat, "Wrap the text as one user message in the chat template");
  cmd->add_option("--chat-template", args->chat_template, "Jinja chat template file overriding the model's");
  cmd->add_flag("--render", args->render, "With --chat/--messages: print the rendered prompt instead of ids");
  cmd->add_flag("--no-special", args->no_special, "Do not apply the post-processor (no BOS)");
  cmd->add_flag("--skip-special", args->skip_special, "With --decode: drop special tokens");
  cmd->callback([args, exit_code, text, file, msgs, dec] {
    if (text->count() + file->count() + msgs->count() + dec->count() == 0) {
      std::fprintf(stderr, "error: tokenize needs --text, --file, --messages or --decode\n");
      *exit_code = 2;
      return;
    }
    const Status s = run_tokenize(*args);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace xds::cli

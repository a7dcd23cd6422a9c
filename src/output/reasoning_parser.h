// Reasoning content: the text a model writes between <think> and </think> goes to
// `reasoning_content`, the rest to `content` (the --reasoning-parser option).
//
// Parsers: "deepseek_r1" and "qwen3" (both use the <think>...</think> tags; DeepSeek-R1's chat
// template opens "<think>\n" in the prompt, so its output starts inside the reasoning without
// the opening tag: the caller says so with `starts_in_reasoning`).
//
// The state machine, over the streamed text:
//   start      -- the output begins with "<think>" --> reasoning (the tag is dropped)
//              -- anything else                    --> content
//   reasoning  -- "</think>"                       --> content (the tag and the newlines
//                                                      right after it are dropped)
//   content    -- stays content (a later "<think>" is plain text)
// A tag split across pushes is held back until it is decided; finish() releases what is held
// (an unfinished "<think" prefix is content, an unfinished "</think" prefix is reasoning, and
// an output cut inside the reasoning leaves everything in reasoning).
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace xds::output {

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // kind: "deepseek_r1" or "qwen3"; anything else is InvalidArgument naming it.
  static Result<ReasoningParser> create(std::string_view kind, bool starts_in_reasoning);

  ReasoningSplit push(std::string_view text);
  ReasoningSplit finish();
  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kStart, kReasoning, kContentStart, kContent };
  explicit ReasoningParser(bool starts_in_reasoning);

  State state_;
  std::string held_;  // undecided text (a tag prefix, or newlines after </think>)
};

}  // namespace xds::output

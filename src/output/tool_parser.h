// Tool calls in the model's text -> OpenAI `tool_calls` (the --tool-call-parser option).
//
// Formats:
//   "deepseek_v3": <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
//                  ```json\nARGS\n```<｜tool▁call▁end｜>[\n<｜tool▁call▁begin｜>...]<｜tool▁calls▁end｜>
//                  (the chat template's spelling; the V3.1 body NAME<｜tool▁sep｜>ARGS is accepted
//                  too)
//   "qwen3":       <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call> (several in a row)
//   "kimi_k2":     <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//                  <|tool_call_argument_begin|>ARGS<|tool_call_end|>[<|tool_call_begin|>...]
//                  <|tool_calls_section_end|> (Kimi K2's chat template; the call's id is the
//                  model's own "functions.NAME:IDX", which the template writes back into the
//                  prompt on the next turn, as vLLM's kimi_k2 parser keeps it)
//
// Streaming: text before a call is content and is released as it comes (a suffix that may be
// the start of a marker is held back); a call is emitted whole once its end marker arrives.
// Markers, and whitespace between and after calls, are dropped. A call whose body does not
// parse (no name, arguments that are not a JSON object, an unfinished call at finish()) stays
// in the content verbatim, markers included: no text is ever lost.
//
// A call's arguments are JSON text: DeepSeek's and Kimi's as the model wrote them (trimmed,
// checked to parse), Qwen3's object re-serialised compactly with its key order kept.
// Ids (DeepSeek, Qwen3) are "call_" + 24 hex digits from a counter-based generator keyed by the caller's seed
// (unique per seed and call; the output processor seeds from the request id and a per-process
// random value).
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "protocol/payloads.h"

namespace xds::output {

struct ToolSplit {
  std::string content;
  std::vector<protocol::ToolCall> calls;  // complete calls, in output order
};

enum class ToolFormat { kDeepSeekV3, kQwen3, kKimiK2 };

class ToolParser {
 public:
  // kind: "deepseek_v3", "qwen3" or "kimi_k2"; anything else is InvalidArgument naming it.
  static Result<ToolParser> create(std::string_view kind, uint64_t id_seed);

  ToolSplit push(std::string_view text);
  // End of the output: releases held-back text; an unfinished call becomes content.
  ToolSplit finish();
  // Number of calls parsed so far.
  int32_t num_calls() const { return num_calls_; }

 private:
  ToolParser(ToolFormat format, uint64_t id_seed) : format_(format), id_seed_(id_seed) {}
  void emit_content(std::string_view s, ToolSplit* out);
  void end_call(std::string_view body, ToolSplit* out);
  std::string next_id();

  ToolFormat format_;
  uint64_t id_seed_;
  int32_t num_calls_ = 0;
  bool in_call_ = false;
  bool after_call_ = false;       // the last thing seen was a parsed call (gaps are dropped)
  bool gap_has_section_ = false;  // gap_ holds a section-begin marker not yet followed by a call
  std::string held_;              // text not yet scanned to a decision (marker prefix, call body)
  std::string gap_;               // whitespace / section marker between structure pieces
};

// Body parsers (between the call markers), exposed for tests. Failure: InvalidArgument.
Result<protocol::ToolCall> parse_deepseek_v3_call(std::string_view body);
Result<protocol::ToolCall> parse_qwen3_call(std::string_view body);
// Kimi K2: "functions.NAME:IDX<|tool_call_argument_begin|>ARGS" (whitespace around the parts
// allowed; the "functions." prefix optional); the id is the text before the argument marker.
Result<protocol::ToolCall> parse_kimi_k2_call(std::string_view body);

}  // namespace xds::output

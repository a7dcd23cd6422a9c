#include "output/reasoning_parser.h"

#include "output/stop_matcher.h"

namespace xds::output {
namespace {
constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";
}  // namespace

Result<ReasoningParser> ReasoningParser::create(std::string_view kind, bool starts_in_reasoning) {
  if (kind != "deepseek_r1" && kind != "qwen3") {
    return invalid_argument("reasoning parser '{}' is unknown (known: deepseek_r1, qwen3)", kind);
  }
  return ReasoningParser(starts_in_reasoning);
}

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningSplit ReasoningParser::push(std::string_view text) {
  ReasoningSplit out;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(text);
  std::string_view rest = buf;
  while (!rest.empty()) {
    switch (state_) {
      case State::kStart: {
        if (rest.size() < kOpen.size() && kOpen.starts_with(rest)) {
          held_.assign(rest);  // still undecided
          return out;
        }
        if (rest.starts_with(kOpen)) {
          rest.remove_prefix(kOpen.size());
          state_ = State::kReasoning;
        } else {
          state_ = State::kContent;
        }
        break;
      }
      case State::kReasoning: {
        const size_t pos = rest.find(kClose);
        if (pos == std::string_view::npos) {
          const size_t hold = partial_suffix(rest, kClose);
          out.reasoning.append(rest.substr(0, rest.size() - hold));
          held_.assign(rest.substr(rest.size() - hold));
          return out;
        }
        out.reasoning.append(rest.substr(0, pos));
        rest.remove_prefix(pos + kClose.size());
        state_ = State::kContentStart;
        break;
      }
      case State::kContentStart: {
        const size_t first = rest.find_first_not_of('\n');
        if (first == std::string_view::npos) return out;  // only newlines so far: dropped
        rest.remove_prefix(first);
        state_ = State::kContent;
        break;
      }
      case State::kContent:
        out.content.append(rest);
        return out;
    }
  }
  return out;
}

ReasoningSplit ReasoningParser::finish() {
  ReasoningSplit out;
  if (state_ == State::kReasoning) {
    out.reasoning = std::move(held_);
  } else if (state_ == State::kStart) {
    out.content = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace xds::output

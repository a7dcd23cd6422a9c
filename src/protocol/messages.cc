#include "protocol/messages.h"

#include <array>
#include <string_view>
#include <utility>

namespace xds::protocol {
namespace {

constexpr size_t kKinds = std::variant_size_v<Message>;
static_assert(kKinds == static_cast<size_t>(MessageKind::kMembership),
              "one MessageKind per alternative of Message, in the same order");

// The tags are the alternatives' positions in Message, from 1.
template <size_t I>
Message decode_body(const nlohmann::json& body) {
  return Message(std::in_place_index<I>, body.get<std::variant_alternative_t<I, Message>>());
}

template <size_t... I>
constexpr std::array<Message (*)(const nlohmann::json&), kKinds> make_decoders(
    std::index_sequence<I...>) {
  return {&decode_body<I>...};
}

constexpr auto kDecoders = make_decoders(std::make_index_sequence<kKinds>());

// Messages nest 8 levels at most (a top-logprob pair inside a token delta inside a tokens
// message); the reader recurses once per level, so deeper input is refused.
constexpr size_t kMaxNesting = 32;

// The payload fields that are floats (payloads.h); a float anywhere else would be converted
// to an integer type, undefined behaviour when out of its range (1e300, NaN, inf).
bool is_float_field(std::string_view key) {
  return key == "temperature" || key == "top_p" || key == "presence_penalty" ||
         key == "frequency_penalty" || key == "repetition_penalty" || key == "logprob" ||
         key == "last_batch_size";
}

// MessagePack -> a JSON tree, as json::from_msgpack builds it, refusing nesting deeper than
// kMaxNesting (before the reader's recursion goes deeper) and floats outside float fields
// (TokenLogprob::top pairs hold [id, logprob]: only their second item).
class MessageReader {
 public:
  explicit MessageReader(nlohmann::json* out) : dom_(*out, /*allow_exceptions=*/false) {}

  bool null() { return item() && dom_.null(); }
  bool boolean(bool v) { return item() && dom_.boolean(v); }
  bool number_integer(nlohmann::json::number_integer_t v) {
    return item() && dom_.number_integer(v);
  }
  bool number_unsigned(nlohmann::json::number_unsigned_t v) {
    return item() && dom_.number_unsigned(v);
  }
  bool number_float(nlohmann::json::number_float_t v, const std::string& s) {
    if (!float_allowed()) {
      return fail(fmt::format("field '{}' holds a float where an integer belongs", field()));
    }
    return item() && dom_.number_float(v, s);
  }
  bool string(std::string& v) { return item() && dom_.string(v); }
  bool binary(nlohmann::json::binary_t& v) { return item() && dom_.binary(v); }
  bool start_object(size_t n) { return enter(false) && dom_.start_object(n); }
  bool key(std::string& k) {
    frames_.back().key = k;
    return dom_.key(k);
  }
  bool end_object() {
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(size_t n) { return enter(true) && dom_.start_array(n); }
  bool end_array() {
    frames_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) {
    return fail("");  // malformed bytes: the caller's message
  }

  const std::string& error() const { return error_; }

 private:
  struct Frame {
    bool array = false;
    std::string key;   // object: the key of the value being read
    size_t items = 0;  // array: values read so far
  };

  bool fail(std::string message) {
    error_ = std::move(message);
    return false;
  }
  // Counts a value of the innermost array.
  bool item() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().items;
    return true;
  }
  bool enter(bool array) {
    item();
    if (frames_.size() >= kMaxNesting)
      return fail(fmt::format("nested deeper than {} levels", kMaxNesting));
    frames_.push_back({array, "", 0});
    return true;
  }
  // The field a value belongs to: the key of the innermost object around it.
  std::string field() const {
    for (size_t k = frames_.size(); k-- > 0;) {
      if (!frames_[k].array) return frames_[k].key;
    }
    return "";
  }
  bool float_allowed() const {
    const size_t n = frames_.size();
    if (n == 0) return false;
    if (!frames_[n - 1].array) return is_float_field(frames_[n - 1].key);
    // "top": [[id, logprob], ...]: the second item of a pair.
    return n >= 3 && frames_[n - 1].items == 1 && frames_[n - 2].array && !frames_[n - 3].array &&
           frames_[n - 3].key == "top";
  }

  nlohmann::detail::json_sax_dom_parser<nlohmann::json> dom_;
  std::vector<Frame> frames_;
  std::string error_;
};

}  // namespace

const char* to_string(InstanceRole role) {
  switch (role) {
    case InstanceRole::kColocated: return "colocated";
    case InstanceRole::kPrefill: return "prefill";
    case InstanceRole::kDecode: return "decode";
  }
  return "unknown";
}

Result<InstanceRole> parse_instance_role(std::string_view text) {
  if (text == "colocated") return InstanceRole::kColocated;
  if (text == "prefill") return InstanceRole::kPrefill;
  if (text == "decode") return InstanceRole::kDecode;
  return invalid_argument("instance role must be colocated, prefill or decode, got '{}'", text);
}

MessageKind kind_of(const Message& m) { return static_cast<MessageKind>(m.index() + 1); }

const char* kind_name(MessageKind kind) {
  static constexpr std::array<const char*, kKinds> kNames = {
      "request", "cancel",       "tokens",        "output",       "load",
      "wake",    "shutdown",     "ping",          "pong",         "rejected",
      "eplb command", "eplb report", "admin request", "admin reply", "eplb state push",
      "failed",  "blocks",       "ended",         "fault",
      "reform", "reformed", "membership"};
  const auto i = static_cast<size_t>(kind);
  return i >= 1 && i <= kKinds ? kNames[i - 1] : "unknown";
}

std::string encode(const Message& m) {
  nlohmann::json j;
  j["v"] = kProtocolVersion;
  j["kind"] = static_cast<int32_t>(kind_of(m));
  std::visit([&](const auto& body) { j["body"] = body; }, m);
  const std::vector<uint8_t> bytes = nlohmann::json::to_msgpack(j);
  return std::string(bytes.begin(), bytes.end());
}

Result<Message> decode(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  nlohmann::json j;
  MessageReader reader(&j);
  const bool read =
      nlohmann::json::sax_parse(p, p + size, &reader, nlohmann::json::input_format_t::msgpack,
                                /*strict=*/true);
  if (!read && !reader.error().empty()) {
    return invalid_argument("control message: {}", reader.error());
  }
  if (!read || j.is_discarded() || !j.is_object()) {
    return invalid_argument("control message: {} bytes are not a MessagePack object", size);
  }
  try {
    const auto v = j.find("v");
    if (v == j.end() || !v->is_number_integer()) {
      return invalid_argument(
          "control message: no protocol version (this process speaks version {})",
          kProtocolVersion);
    }
    const int64_t version = v->get<int64_t>();
    if (version != kProtocolVersion) {
      return invalid_argument(
          "control message: protocol version {} from the peer, this process speaks version {}",
          version, kProtocolVersion);
    }
    const auto k = j.find("kind");
    if (k == j.end() || !k->is_number_integer()) {
      return invalid_argument("control message: no kind");
    }
    const int64_t kind = k->get<int64_t>();
    if (kind < 1 || kind > static_cast<int64_t>(kKinds)) {
      return invalid_argument("control message: unknown kind {}", kind);
    }
    const auto body = j.find("body");
    if (body == j.end() || !body->is_object()) {
      return invalid_argument("control message: a {} message without a body",
                              kind_name(static_cast<MessageKind>(kind)));
    }
    return kDecoders[static_cast<size_t>(kind - 1)](*body);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("control message: {}", e.what());
  }
}

}  // namespace xds::protocol

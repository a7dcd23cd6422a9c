#include "protocol/messages.h"

#include <array>
#include <utility>

namespace xds::protocol {
namespace {

constexpr size_t kKinds = std::variant_size_v<Message>;
static_assert(kKinds == static_cast<size_t>(MessageKind::kFault),
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
      "failed",  "blocks",       "ended",         "fault"};
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
  const nlohmann::json j = nlohmann::json::from_msgpack(p, p + size, /*strict=*/true,
                                                        /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
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

#include "engine/request.h"

namespace xds::engine {

std::string encode(const Message& m) {
  nlohmann::json j;
  j["kind"] = static_cast<int>(m.kind);
  if (!m.request_id.empty()) j["request_id"] = m.request_id;
  if (m.request) j["request"] = *m.request;
  if (!m.tokens.empty()) j["tokens"] = m.tokens;
  if (!m.outputs.empty()) j["outputs"] = m.outputs;
  if (!m.loads.empty()) j["loads"] = m.loads;
  if (!m.text.empty()) j["text"] = m.text;
  if (m.seq != 0) j["seq"] = m.seq;
  if (m.group >= 0) j["group"] = m.group;
  if (m.index >= 0) j["index"] = m.index;
  if (m.eplb) j["eplb"] = *m.eplb;
  if (m.eplb_report) j["eplb_report"] = *m.eplb_report;
  if (!m.blocks_added.empty()) j["blocks_added"] = m.blocks_added;
  if (!m.blocks_removed.empty()) j["blocks_removed"] = m.blocks_removed;
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
  Message m;
  try {
    const int kind = j.at("kind").get<int>();
    if (kind < static_cast<int>(MessageKind::kRequest) ||
        kind > static_cast<int>(MessageKind::kBlocks)) {
      return invalid_argument("control message: unknown kind {}", kind);
    }
    m.kind = static_cast<MessageKind>(kind);
    if (auto it = j.find("request_id"); it != j.end()) m.request_id = it->get<std::string>();
    if (auto it = j.find("request"); it != j.end()) m.request = it->get<EngineRequest>();
    if (auto it = j.find("tokens"); it != j.end()) m.tokens = it->get<std::vector<TokenDelta>>();
    if (auto it = j.find("outputs"); it != j.end())
      m.outputs = it->get<std::vector<OutputDelta>>();
    if (auto it = j.find("loads"); it != j.end()) m.loads = it->get<std::vector<GroupLoad>>();
    if (auto it = j.find("text"); it != j.end()) m.text = it->get<std::string>();
    if (auto it = j.find("seq"); it != j.end()) m.seq = it->get<uint64_t>();
    if (auto it = j.find("group"); it != j.end()) m.group = it->get<int32_t>();
    if (auto it = j.find("index"); it != j.end()) m.index = it->get<int32_t>();
    if (auto it = j.find("eplb"); it != j.end()) m.eplb = it->get<EplbCommand>();
    if (auto it = j.find("eplb_report"); it != j.end()) m.eplb_report = it->get<EplbReport>();
    if (auto it = j.find("blocks_added"); it != j.end())
      m.blocks_added = it->get<std::vector<uint64_t>>();
    if (auto it = j.find("blocks_removed"); it != j.end())
      m.blocks_removed = it->get<std::vector<uint64_t>>();
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("control message: {}", e.what());
  }
  return m;
}

void merge_load(GroupLoad& kept, GroupLoad incoming) {
  if (incoming.expert_tokens.empty()) {
    incoming.expert_tokens = std::move(kept.expert_tokens);
    incoming.moe_layers = std::move(kept.moe_layers);
    incoming.n_experts = kept.n_experts;
  }
  // Windows are consumed where they arrive (the shell's EPLB collector), not kept.
  incoming.window_seq = 0;
  incoming.window_expert_tokens.clear();
  incoming.window_slot_tokens.clear();
  kept = std::move(incoming);
}

}  // namespace xds::engine

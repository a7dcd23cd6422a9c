#include "protocol/payloads.h"

namespace xds::protocol {

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

}  // namespace xds::protocol

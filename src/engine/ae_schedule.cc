#include "engine/ae_schedule.h"

#include <algorithm>

namespace xds::engine {

Status validate_ae_shape(const AeShape& s) {
  if (s.attention < 1 || s.attention > 64)
    return invalid_argument("--attention-dp must be in [1, 64], got {}", s.attention);
  if (s.experts < 1 || s.experts > 64)
    return invalid_argument("--expert-devices must be in [1, 64], got {}", s.experts);
  if (s.domains < 1 || s.domains > std::min(s.attention, kMaxAeDomains))
    return invalid_argument("--dp-domains must be in [1, min(--attention-dp {}, {})], got {}",
                            s.attention, kMaxAeDomains, s.domains);
  if (s.microbatches < 1 || s.microbatches > kMaxAeMicrobatches)
    return invalid_argument("--microbatches must be in [1, {}], got {}", kMaxAeMicrobatches,
                            s.microbatches);
  const int largest = (s.attention + s.domains - 1) / s.domains;
  if (largest > s.experts)
    return invalid_argument(
        "--attention-dp {} in --dp-domains {} puts {} attention groups in one domain, but each "
        "needs its own trampoline expert device and --expert-devices is {}",
        s.attention, s.domains, largest, s.experts);
  return Status::ok_status();
}

int ae_world_size(const AeShape& s) { return s.attention + s.experts; }

bool ae_is_expert_rank(const AeShape& s, int rank) {
  return rank >= s.attention && rank < ae_world_size(s);
}

std::vector<int> ae_domain_starts(const AeShape& s) {
  std::vector<int> first(size_t(s.domains) + 1, 0);
  const int base = s.attention / s.domains, extra = s.attention % s.domains;
  for (int d = 0; d < s.domains; ++d) first[size_t(d) + 1] = first[size_t(d)] + base + (d < extra);
  return first;
}

int ae_domain_of(const AeShape& s, int rank) {
  if (rank < 0 || rank >= s.attention) return -1;
  const std::vector<int> first = ae_domain_starts(s);
  return int(std::upper_bound(first.begin(), first.end(), rank) - first.begin()) - 1;
}

xccl::A2eTopology ae_topology(const AeShape& s) {
  xccl::A2eTopology t;
  const std::vector<int> first = ae_domain_starts(s);
  for (int d = 0; d < s.domains; ++d) {
    t.domains.emplace_back();
    for (int r = first[size_t(d)]; r < first[size_t(d) + 1]; ++r) t.domains.back().push_back(r);
  }
  for (int e = 0; e < s.experts; ++e) t.experts.push_back(s.attention + e);
  return t;
}

int ae_trampoline_of(const AeShape& s, int rank) {
  const int d = ae_domain_of(s, rank);
  if (d < 0) return -1;
  return s.attention + (rank - ae_domain_starts(s)[size_t(d)]);
}

std::vector<int64_t> microbatch_bounds(int64_t n, int m) {
  std::vector<int64_t> b(size_t(std::max(m, 1)) + 1, 0);
  if (m < 1) {
    b[1] = std::max<int64_t>(n, 0);
    return b;
  }
  const int64_t base = std::max<int64_t>(n, 0) / m, extra = std::max<int64_t>(n, 0) % m;
  for (int i = 0; i < m; ++i) b[size_t(i) + 1] = b[size_t(i)] + base + (i < extra ? 1 : 0);
  return b;
}

std::vector<AeTurn> ae_expert_turns(int n_moe_layers, int domains, int microbatches) {
  std::vector<AeTurn> turns;
  turns.reserve(size_t(std::max(0, n_moe_layers * domains * microbatches)));
  for (int l = 0; l < n_moe_layers; ++l)
    for (int d = 0; d < domains; ++d)
      for (int m = 0; m < microbatches; ++m) turns.push_back(AeTurn{l, d, m});
  return turns;
}

}  // namespace xds::engine

// Device program and plain reference for the A2E/E2A tests (thread and process fabrics).
#pragma once

#include <cstring>

#include "moe_reference.h"
#include "xccl/a2e.h"

namespace xds::xccl::testing {

struct A2eCase {
  MoeCase moe;  // world = expert devices; n_tokens indexed by attention rank
  A2eTopology topo;
  int steps = 2;
};

inline A2eCase a2e_case(bool int8) {
  A2eCase c;
  c.topo = {{{0, 1, 2}, {3, 4, 5}}, {6, 7, 8, 9, 10}};
  c.moe.world = 5;
  c.moe.hidden = 48;
  c.moe.topk = 4;
  c.moe.n_logical = 10;
  c.moe.slots = 3;
  c.moe.max_tokens = 12;
  c.moe.n_tokens = {5, 0, 12, 7, 3, 9};  // attention rank 1 has no tokens
  c.moe.int8 = int8;
  c.moe.seed = 77;
  return c;
}

inline MoeConfig a2e_moe_config(const A2eCase& c) {
  return MoeConfig{.hidden = c.moe.hidden,
                   .topk = c.moe.topk,
                   .max_tokens = c.moe.max_tokens,
                   .slots_per_device = c.moe.slots,
                   .int8 = c.moe.int8,
                   .timeout_ms = 60'000};
}

inline ArenaConfig a2e_arena(const A2eCase& c) {
  ArenaConfig a;
  a.world_size = 11;
  a.lanes = 1;
  a.ring_slots = 1;
  a.slot_bytes = 64;
  a.staging_bytes = a2e_layout(a2e_moe_config(c), c.topo, 0).end;
  a.app_bytes = 0;
  return a;
}

// Checks the rows expert position `e` received for domain d against the reference order:
// local expert, then attention position, then token.
inline Status check_a2e_rows(const A2eCase& c, int d, int e, const A2e& a) {
  const MoeCase& m = c.moe;
  const ExpertMap map = make_map(m);
  const auto& dom = c.topo.domains[size_t(d)];
  const auto& got = a.exchange().received();
  size_t r = 0;
  for (int s = 0; s < m.slots; ++s)
    for (size_t i = 0; i < dom.size(); ++i) {
      const DeviceInput in = make_input(m, dom[i]);
      for (int t = 0; t < m.n_tokens[size_t(dom[i])]; ++t)
        for (int j = 0; j < m.topk; ++j) {
          const int32_t id = in.ids[size_t(t * m.topk + j)];
          if (id < 0) continue;
          const int p = map.physical(id, uint32_t(t));
          if (p / m.slots != e || p % m.slots != s) continue;
          if (r >= size_t(got.n_rows()))
            return internal_error("expert {} domain {}: only {} rows", e, d, got.n_rows());
          const auto [src, tok] = a.row_source(int(r));
          const RowOrigin& o = got.rows[r];
          if (src != dom[i] || int(tok) != t || o.expert != s ||
              o.weight != in.w[size_t(t * m.topk + j)])
            return internal_error(
                "expert {} domain {} row {}: got (att {}, token {}, slot {}), "
                "reference (att {}, token {}, slot {})",
                e, d, r, src, tok, o.expert, dom[i], t, s);
          const uint16_t* x = in.x.data() + size_t(t) * size_t(m.hidden);
          const uint16_t* y = a.row(int(r));
          float amax = 0;
          for (int h = 0; h < m.hidden; ++h) amax = std::max(amax, std::fabs(bf16_to_float(x[h])));
          for (int h = 0; h < m.hidden; ++h) {
            const float tol =
                m.int8 ? amax / 254.f + std::fabs(bf16_to_float(x[h])) / 128.f + 1e-6f : 0.f;
            if (std::fabs(bf16_to_float(x[h]) - bf16_to_float(y[h])) > tol)
              return internal_error("expert {} row {} elem {} differs", e, r, h);
          }
          ++r;
        }
    }
  if (r != size_t(got.n_rows()))
    return internal_error("expert {} domain {}: {} rows, reference {}", e, d, got.n_rows(), r);
  return Status::ok_status();
}

// The program every device runs: `steps` steps; experts serve domain 0 then domain 1.
inline Status run_a2e_device(Fabric& f, const A2eCase& c, ThreadPool* pool) {
  auto t = make_transport("shm", f);
  if (!t.ok()) return t.status();
  Mailbox mb(f, **t);
  XDS_ASSIGN_OR_RETURN(auto a, A2e::create(mb, a2e_moe_config(c), c.topo, pool));
  const MoeCase& m = c.moe;
  const ExpertMap map = make_map(m);
  for (int step = 0; step < c.steps; ++step) {
    if (a->is_attention()) {
      const AttentionPos pos = attention_pos(c.topo, f.rank());
      const uint64_t key = a2e_key(f.epoch(), uint32_t(step), 1, pos.domain, 0);
      const DeviceInput in = make_input(m, f.rank());
      const int n = m.n_tokens[size_t(f.rank())];
      XDS_ASSIGN_OR_RETURN(uint16_t * x, a->input_rows());
      if (n > 0) std::memcpy(x, in.x.data(), in.x.size() * 2);
      XDS_RETURN_IF_ERROR(a->a2e_send(n, in.ids, in.w, key));
      std::vector<uint16_t> out(size_t(n) * size_t(m.hidden));
      XDS_RETURN_IF_ERROR(a->e2a_recv(out.data(), key));
      MoeCase one = m;  // check_combined's INT8 term: every row was quantized (dev = -1)
      XDS_RETURN_IF_ERROR(
          check_combined(one, in, /*dev=*/m.int8 ? -1 : f.rank(), out)
              .with_context(fmt::format("attention rank {} step {}", f.rank(), step)));
    } else {
      const int e = int(std::find(c.topo.experts.begin(), c.topo.experts.end(), f.rank()) -
                        c.topo.experts.begin());
      for (int d = 0; d < int(c.topo.domains.size()); ++d) {
        const uint64_t key = a2e_key(f.epoch(), uint32_t(step), 1, d, 0);
        XDS_RETURN_IF_ERROR(a->a2e_recv(d, map, key));
        XDS_RETURN_IF_ERROR(check_a2e_rows(c, d, e, *a));
        run_experts(m, e, a->exchange(), a->expert_out());
        XDS_RETURN_IF_ERROR(a->e2a_send(key));
      }
    }
  }
  return Status::ok_status();
}

}  // namespace xds::xccl::testing

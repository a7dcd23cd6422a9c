// A plain re-implementation of dispatch/combine to check XCCL against (DeepEP-style tests):
// every device regenerates every device's tokens and routing from the case seed, and the
// reference computes, with nested loops and doubles, what each device must receive and what
// combine must return.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "test_util.h"
#include "xccl/expert_map.h"
#include "xccl/moe.h"
#include "xccl/rowops.h"

namespace xds::xccl::testing {

enum class Routing { kRandom, kAllLocal, kStarveLast };

struct MoeCase {
  int world = 2;
  int hidden = 64;
  int topk = 4;
  int n_logical = 8;
  int slots = 5;  // slots per device (identity uses ceil(n_logical / world), the rest are spares)
  int max_tokens = 16;
  std::vector<int> n_tokens;  // [world]
  uint64_t seed = 1;
  bool int8 = false;
  Routing routing = Routing::kRandom;
};

struct DeviceInput {
  std::vector<uint16_t> x;   // [n, hidden] bf16
  std::vector<int32_t> ids;  // [n, topk] logical
  std::vector<float> w;      // [n, topk]
};

inline ExpertMap make_map(const MoeCase& c) {
  ExpertMap m = ExpertMap::identity(c.n_logical, c.world, c.slots, /*version=*/5);
  const int per_dev = (c.n_logical + c.world - 1) / c.world;
  // Replicas in spare slots for every third expert (round-robin by token).
  int spare = per_dev;
  for (int e = 0; e < c.n_logical && spare < c.slots; e += 3, ++spare)
    m.replicas[size_t(e)].push_back(((e / per_dev + 1) % c.world) * c.slots + spare);
  return m;
}

inline DeviceInput make_input(const MoeCase& c, int dev) {
  const int n = c.n_tokens[size_t(dev)];
  DeviceInput in;
  in.x.resize(size_t(n) * size_t(c.hidden));
  for (size_t i = 0; i < in.x.size(); ++i) {
    const uint64_t r = mix(c.seed * 1000003 + uint64_t(dev) * 7919 + i);
    in.x[i] = float_to_bf16(float(int64_t(r % 2001) - 1000) / 250.f);
  }
  const int per_dev = (c.n_logical + c.world - 1) / c.world;
  in.ids.assign(size_t(n) * size_t(c.topk), -1);
  in.w.assign(size_t(n) * size_t(c.topk), 0.f);
  for (int t = 0; t < n; ++t) {
    std::vector<int> pool;
    for (int e = 0; e < c.n_logical; ++e) {
      const int home = e / per_dev;
      if (c.routing == Routing::kAllLocal && home != dev) continue;
      if (c.routing == Routing::kStarveLast && home == c.world - 1) continue;
      pool.push_back(e);
    }
    for (int j = 0; j < c.topk && !pool.empty(); ++j) {
      const uint64_t r = mix(c.seed ^ (uint64_t(dev) << 40) ^ (uint64_t(t) << 8) ^ uint64_t(j));
      const size_t pick = r % pool.size();
      // Token 1 of every device leaves its last slot empty (masked expert).
      if (!(t == 1 && j == c.topk - 1)) {
        in.ids[size_t(t * c.topk + j)] = pool[pick];
        in.w[size_t(t * c.topk + j)] = float((r >> 20) % 1000 + 1) / 1000.f;
      }
      pool.erase(pool.begin() + long(pick));
    }
  }
  return in;
}

inline float expert_scale(const MoeCase& c, int dev, int slot) {
  return 1.f + float(dev * c.slots + slot) / 16.f;
}

// The "engine" of the tests: output row = bf16(row * scale(device, slot)).
// Gathers each grouped row's input through ex.row(r), as an expert GEMM would.
inline void run_experts(const MoeCase& c, int dev, const Exchange& ex, uint16_t* out) {
  const auto& L = ex.received();
  for (int r = 0; r < L.n_rows(); ++r) {
    const float s = expert_scale(c, dev, L.rows[size_t(r)].expert);
    const uint16_t* x = ex.row(r);
    for (int h = 0; h < c.hidden; ++h)
      out[size_t(r) * size_t(c.hidden) + size_t(h)] = float_to_bf16(bf16_to_float(x[h]) * s);
  }
}

struct ExpectedRow {
  int src, token, expert;
  float weight;
};

// Rows receiver `dev` must get in one round where source s sends tokens [begin_s, end_s):
// grouped by expert, then source, then token.
inline std::vector<ExpectedRow> expected_rows(const MoeCase& c, const std::vector<DeviceInput>& in,
                                              int dev, const std::vector<int>& begin,
                                              const std::vector<int>& end) {
  const ExpertMap m = make_map(c);
  std::vector<ExpectedRow> out;
  for (int e = 0; e < c.slots; ++e)
    for (int s = 0; s < c.world; ++s)
      for (int t = begin[size_t(s)]; t < end[size_t(s)]; ++t)
        for (int j = 0; j < c.topk; ++j) {
          const int32_t id = in[size_t(s)].ids[size_t(t * c.topk + j)];
          if (id < 0) continue;
          const int p = m.physical(id, uint32_t(t - begin[size_t(s)]));
          if (p / c.slots == dev && p % c.slots == e)
            out.push_back({s, t - begin[size_t(s)], e, in[size_t(s)].w[size_t(t * c.topk + j)]});
        }
  return out;
}

// Checks one round's received rows on `dev` against the reference (INT8: within scale / 2
// plus bf16 rounding for rows from other devices; exact otherwise).
inline Status check_received(const MoeCase& c, const std::vector<DeviceInput>& in, int dev,
                             const std::vector<int>& begin, const std::vector<int>& end,
                             const Exchange& ex) {
  const auto want = expected_rows(c, in, dev, begin, end);
  const auto& got = ex.received();
  if (size_t(got.n_rows()) != want.size())
    return internal_error("device {}: {} rows received, reference {}", dev, got.n_rows(),
                          want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    const RowOrigin& g = got.rows[r];
    const ExpectedRow& w = want[r];
    if (g.src != w.src || int(g.token) != w.token || g.expert != w.expert || g.weight != w.weight)
      return internal_error(
          "device {} row {}: got (src {}, token {}, expert {}, w {}), reference "
          "(src {}, token {}, expert {}, w {})",
          dev, r, g.src, g.token, g.expert, g.weight, w.src, w.token, w.expert, w.weight);
    const uint16_t* x =
        in[size_t(w.src)].x.data() + size_t(begin[size_t(w.src)] + w.token) * size_t(c.hidden);
    const uint16_t* y = ex.row(int(r));
    float amax = 0;
    for (int h = 0; h < c.hidden; ++h) amax = std::max(amax, std::fabs(bf16_to_float(x[h])));
    const bool quant = c.int8 && w.src != dev;
    for (int h = 0; h < c.hidden; ++h) {
      const float a = bf16_to_float(x[h]), b = bf16_to_float(y[h]);
      const float tol = quant ? amax / 127.f / 2.f + std::fabs(a) / 128.f + 1e-6f : 0.f;
      if (std::fabs(a - b) > tol)
        return internal_error("device {} row {} elem {}: got {}, sent {}, tolerance {}", dev, r, h,
                              b, a, tol);
    }
  }
  return Status::ok_status();
}

// Checks combine output of source `dev` (all its tokens) against sum_k w_k * scale_k * x.
// With INT8, rows from devices other than `dev` carry the quantization bound (dev = -1: all).
inline Status check_combined(const MoeCase& c, const DeviceInput& in, int dev,
                             const std::vector<uint16_t>& out) {
  const ExpertMap m = make_map(c);
  const int n = int(in.x.size() / size_t(c.hidden));
  for (int t = 0; t < n; ++t) {
    const uint16_t* x = in.x.data() + size_t(t) * size_t(c.hidden);
    float amax = 0;
    for (int h = 0; h < c.hidden; ++h) amax = std::max(amax, std::fabs(bf16_to_float(x[h])));
    for (int h = 0; h < c.hidden; ++h) {
      double ref = 0, mag = 0, qerr = 0;
      for (int j = 0; j < c.topk; ++j) {
        const int32_t id = in.ids[size_t(t * c.topk + j)];
        if (id < 0) continue;
        const int p = m.physical(id, uint32_t(t % c.max_tokens));
        const double ws =
            double(in.w[size_t(t * c.topk + j)]) * expert_scale(c, p / c.slots, p % c.slots);
        ref += ws * bf16_to_float(x[h]);
        mag += std::fabs(ws * bf16_to_float(x[h]));
        if (c.int8 && p / c.slots != dev)
          qerr += std::fabs(ws) * (amax / 127.0 / 2.0 + std::fabs(bf16_to_float(x[h])) / 128.0);
      }
      // bf16 roundings: expert output, pre-sum, final sum (2^-8 relative each), plus INT8.
      const double tol = 4.0 * mag / 256.0 + qerr + 1e-6;
      const double got = bf16_to_float(out[size_t(t) * size_t(c.hidden) + size_t(h)]);
      if (std::fabs(got - ref) > tol)
        return internal_error("device {} token {} elem {}: combine {} reference {} tolerance {}",
                              dev, t, h, got, ref, tol);
    }
  }
  return Status::ok_status();
}

}  // namespace xds::xccl::testing

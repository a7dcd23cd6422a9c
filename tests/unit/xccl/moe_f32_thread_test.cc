// Dispatch/combine with f32 token rows (and f32 or bf16 combine vectors) over the thread
// fabric, checked against a plain re-implementation: the routing of moe_reference.h (spare
// slots, replicas round-robin by token, masked experts), full-precision f32 rows that no bf16
// could hold, received rows compared bit for bit, and combine outputs against a double sum
// within f32 rounding (a bf16 step anywhere would miss it by ~2^-9 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "moe_reference.h"
#include "xccl/thread_fabric.h"

namespace xds::xccl {
namespace {

using testing::MoeCase;

// Row h of token t of device dev: a float with all 24 mantissa bits in use, in (-4, 4).
float f32_value(const MoeCase& c, int dev, size_t i) {
  const uint64_t r = testing::mix(c.seed * 7777 + uint64_t(dev) * 1000003 + i);
  return float(double(r >> 11) / double(1ull << 53) * 8.0 - 4.0);
}

std::vector<float> f32_rows(const MoeCase& c, int dev) {
  std::vector<float> x(size_t(c.n_tokens[size_t(dev)]) * size_t(c.hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = f32_value(c, dev, i);
  return x;
}

MoeConfig f32_config(const MoeCase& c, RowDType vectors, bool contiguous = false) {
  MoeConfig m{.hidden = c.hidden,
              .topk = c.topk,
              .max_tokens = c.max_tokens,
              .slots_per_device = c.slots,
              .timeout_ms = 60'000};
  m.row_dtype = RowDType::kF32;
  m.vector_dtype = vectors;
  m.contiguous_rows = contiguous;
  return m;
}

ArenaConfig arena(const MoeCase& c, const MoeConfig& m) {
  ArenaConfig a;
  a.world_size = c.world;
  a.lanes = 1;
  a.ring_slots = 1;
  a.slot_bytes = 64;
  a.staging_bytes = moe_staging_bytes(m, c.world);
  a.app_bytes = 0;
  return a;
}

// Round `round`'s received rows on `me`: the reference's (source, token, expert, weight) order,
// and each row's bytes equal to the source's f32 row.
Status check_rows(const MoeCase& c, const std::vector<testing::DeviceInput>& in,
                  const std::vector<std::vector<float>>& x, int me, int round, const Exchange& ex) {
  std::vector<int> b(size_t(c.world)), e(size_t(c.world));
  for (int s = 0; s < c.world; ++s) {
    b[size_t(s)] = std::min(c.n_tokens[size_t(s)], round * c.max_tokens);
    e[size_t(s)] = std::min(c.n_tokens[size_t(s)], b[size_t(s)] + c.max_tokens);
  }
  const auto want = testing::expected_rows(c, in, me, b, e);
  const RecvLayout& got = ex.received();
  if (size_t(got.n_rows()) != want.size())
    return internal_error("rank {} round {}: {} rows, reference {}", me, round, got.n_rows(),
                          want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    const RowOrigin& g = got.rows[r];
    if (g.src != want[r].src || int(g.token) != want[r].token || g.expert != want[r].expert ||
        g.weight != want[r].weight)
      return internal_error("rank {} round {} row {}: origin differs from the reference", me,
                            round, r);
    const float* sent = x[size_t(g.src)].data() +
                        size_t(b[size_t(g.src)] + want[r].token) * size_t(c.hidden);
    if (std::memcmp(ex.row_f32(int(r)), sent, size_t(c.hidden) * 4) != 0)
      return internal_error("rank {} round {} row {}: f32 row differs from the sender's", me,
                            round, r);
    const std::byte* in_buffer =
        ex.unit_rows() + size_t(ex.row_units()[r]) * size_t(c.hidden) * 4;
    if (ex.config().contiguous_rows && ex.row_data(int(r)) != in_buffer)
      return internal_error("rank {} round {} row {}: not in the unit buffer", me, round, r);
  }
  return Status::ok_status();
}

// Combine output of `me` against sum_j w_j * scale_j * x in double. f32 vectors: within f32
// rounding of every term (expert output, pre-sum, final sum); bf16 vectors: bf16 bounds.
Status check_out(const MoeCase& c, const testing::DeviceInput& in, const std::vector<float>& x,
                 int me, RowDType vectors, const std::vector<float>& out) {
  const ExpertMap m = testing::make_map(c);
  const double rel = vectors == RowDType::kF32 ? 16.0 * std::ldexp(1.0, -24) : 4.0 / 256.0;
  for (int t = 0; t < c.n_tokens[size_t(me)]; ++t)
    for (int h = 0; h < c.hidden; ++h) {
      const double xv = x[size_t(t) * size_t(c.hidden) + size_t(h)];
      double ref = 0, mag = 0;
      for (int j = 0; j < c.topk; ++j) {
        const int32_t id = in.ids[size_t(t * c.topk + j)];
        if (id < 0) continue;
        const int p = m.physical(id, uint32_t(t % c.max_tokens));
        const double ws = double(in.w[size_t(t * c.topk + j)]) *
                          testing::expert_scale(c, p / c.slots, p % c.slots);
        ref += ws * xv;
        mag += std::fabs(ws * xv);
      }
      const double got = out[size_t(t) * size_t(c.hidden) + size_t(h)];
      if (std::fabs(got - ref) > rel * mag + 1e-30)
        return internal_error("rank {} token {} elem {}: combine {} reference {} (tolerance {})",
                              me, t, h, got, ref, rel * mag);
    }
  return Status::ok_status();
}

// Expert "slot s of device d": y = x * scale(d, s), in f32 (one rounding).
void f32_experts(const MoeCase& c, int me, const Exchange& ex, float* y) {
  const RecvLayout& l = ex.received();
  for (int r = 0; r < l.n_rows(); ++r) {
    const float s = testing::expert_scale(c, me, l.rows[size_t(r)].expert);
    const float* xr = ex.row_f32(r);
    for (int h = 0; h < c.hidden; ++h) y[size_t(r) * size_t(c.hidden) + size_t(h)] = xr[h] * s;
  }
}

Status run_f32_case(Fabric& f, const MoeCase& c, RowDType vectors, bool contiguous,
                    int pool_threads) {
  auto t = make_transport("shm", f);
  Mailbox mb(f, **t);
  ThreadPool pool(pool_threads);
  ExchangeRoles roles;
  for (int r = 0; r < c.world; ++r) {
    roles.senders.push_back(r);
    roles.receivers.push_back(r);
  }
  roles.staging_base = f.layout().staging;
  XDS_ASSIGN_OR_RETURN(auto ex,
                       Exchange::create(mb, f32_config(c, vectors, contiguous), roles, &pool));
  const int me = f.rank();
  std::vector<testing::DeviceInput> in;
  std::vector<std::vector<float>> x;
  for (int d = 0; d < c.world; ++d) {
    in.push_back(testing::make_input(c, d));
    x.push_back(f32_rows(c, d));
  }
  const ExpertMap map = testing::make_map(c);
  const size_t H = size_t(c.hidden), K = size_t(c.topk);
  const int n = c.n_tokens[size_t(me)];
  std::vector<float> out(size_t(n) * H, std::nanf(""));
  std::vector<uint16_t> out16(size_t(c.max_tokens) * H);
  // Two steps on one Exchange, each in rounds of at most max_tokens (all devices join every
  // round until nobody has more).
  for (uint32_t step = 0; step < 2; ++step) {
    for (int round = 0;; ++round) {
      const int begin = std::min(n, round * c.max_tokens);
      const int m = std::min(n - begin, c.max_tokens);
      const uint64_t key = collective_key(f.epoch(), step, 7, uint16_t(round));
      XDS_ASSIGN_OR_RETURN(float* rows, ex->input_rows_f32());
      if (m > 0) std::memcpy(rows, x[size_t(me)].data() + size_t(begin) * H, size_t(m) * H * 4);
      XDS_RETURN_IF_ERROR(ex->dispatch(
          m, std::span(in[size_t(me)].ids).subspan(size_t(begin) * K, size_t(m) * K),
          std::span(in[size_t(me)].w).subspan(size_t(begin) * K, size_t(m) * K), map, key,
          begin + m < n));
      XDS_RETURN_IF_ERROR(check_rows(c, in, x, me, round, *ex));
      const size_t n_rows = size_t(ex->received().n_rows());
      if (vectors == RowDType::kF32) {
        f32_experts(c, me, *ex, ex->expert_out_f32());
        XDS_RETURN_IF_ERROR(ex->combine(out.data() + size_t(begin) * H, key));
      } else {
        std::vector<float> y(n_rows * H);
        f32_experts(c, me, *ex, y.data());
        for (size_t i = 0; i < y.size(); ++i) ex->expert_out()[i] = float_to_bf16(y[i]);
        XDS_RETURN_IF_ERROR(ex->combine(out16.data(), key));
        for (size_t i = 0; i < size_t(m) * H; ++i)
          out[size_t(begin) * H + i] = bf16_to_float(out16[i]);
      }
      if (!ex->any_more()) break;
    }
    XDS_RETURN_IF_ERROR(check_out(c, in[size_t(me)], x[size_t(me)], me, vectors, out)
                            .with_context(fmt::format("step {}", step)));
  }
  return ex->finish();
}

void run_f32_everywhere(const MoeCase& c, RowDType vectors, bool contiguous,
                        int pool_threads = 1) {
  auto tf = ThreadFabric::create(arena(c, f32_config(c, vectors)), 4);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  auto st = (*tf)->run(
      [&](Fabric& f) { return run_f32_case(f, c, vectors, contiguous, pool_threads); });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

TEST(XcclMoeF32Thread, F32RowsAndVectorsTwoToFourDevicesWithSpareSlots) {
  for (int W = 2; W <= 4; ++W) {
    MoeCase c;
    c.world = W;
    c.n_logical = 4 * W;
    c.slots = 4 + 2;  // E / N primary slots + 2 spare slots per device (replicas in some)
    c.topk = 4;
    c.hidden = 72;  // not a multiple of the 64-column block: the tail path too
    c.seed = 101 + uint64_t(W);
    for (int d = 0; d < W; ++d) c.n_tokens.push_back(4 + 6 * d);
    run_f32_everywhere(c, RowDType::kF32, /*contiguous=*/false, W == 3 ? 2 : 1);
  }
}

TEST(XcclMoeF32Thread, F32RowsInRoundsWithADeviceWithoutTokens) {
  MoeCase c;
  c.world = 3;
  c.n_logical = 9;
  c.slots = 4;
  c.max_tokens = 8;
  c.hidden = 64;
  c.n_tokens = {19, 0, 5};  // 3 rounds; device 1 joins all with zero tokens
  run_f32_everywhere(c, RowDType::kF32, /*contiguous=*/false, 2);
  // Own rows copied into the unit buffer too (what a grouped expert GEMM gathers from).
  run_f32_everywhere(c, RowDType::kF32, /*contiguous=*/true, 2);
}

TEST(XcclMoeF32Thread, F32RowsWithBf16Vectors) {
  MoeCase c;
  c.world = 2;
  c.hidden = 128;
  c.n_tokens = {11, 6};
  run_f32_everywhere(c, RowDType::kBf16, /*contiguous=*/true);
}

TEST(XcclMoeF32Thread, RunMoeRoundsF32MatchesTheReference) {
  MoeCase c;
  c.world = 2;
  c.max_tokens = 4;
  c.hidden = 64;
  c.n_tokens = {9, 2};
  const MoeConfig mc = f32_config(c, RowDType::kF32);
  auto tf = ThreadFabric::create(arena(c, mc), 4);
  ASSERT_TRUE(tf.ok());
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    ExchangeRoles roles{{0, 1}, {0, 1}, f.layout().staging};
    XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, mc, roles, nullptr));
    const int me = f.rank();
    const auto in = testing::make_input(c, me);
    const auto x = f32_rows(c, me);
    std::vector<float> out(x.size(), std::nanf(""));
    XDS_RETURN_IF_ERROR(run_moe_rounds(
        *ex, x.data(), in.ids, in.w, c.n_tokens[size_t(me)], testing::make_map(c),
        collective_key(f.epoch(), 1, 2, 0),
        [&](const Exchange& e, float* y) { f32_experts(c, me, e, y); }, out.data()));
    XDS_RETURN_IF_ERROR(check_out(c, in, x, me, RowDType::kF32, out));
    return ex->finish();
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

// Wrong types are errors that name them, on every rank and before anything is posted (no
// device is left waiting).
TEST(XcclMoeF32Thread, MismatchedRowTypesAreClearErrors) {
  MoeCase c;
  c.world = 2;
  c.n_tokens = {3, 3};
  MoeConfig mc = f32_config(c, RowDType::kF32);
  auto tf = ThreadFabric::create(arena(c, mc), 4);
  ASSERT_TRUE(tf.ok());
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    ExchangeRoles roles{{0, 1}, {0, 1}, f.layout().staging};
    MoeConfig int8 = mc;
    int8.int8 = true;
    auto bad = Exchange::create(mb, int8, roles, nullptr);
    if (bad.ok() || bad.status().message().find("f32") == std::string::npos)
      return internal_error("INT8 over f32 rows accepted: {}", bad.status().to_string());
    XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, mc, roles, nullptr));
    auto rows16 = ex->input_rows();
    if (rows16.ok() || rows16.status().code() != StatusCode::kFailedPrecondition)
      return internal_error("bf16 input rows of an f32 exchange: {}", rows16.status().to_string());
    const auto in = testing::make_input(c, f.rank());
    XDS_ASSIGN_OR_RETURN(float* rows, ex->input_rows_f32());
    const auto x = f32_rows(c, f.rank());
    std::memcpy(rows, x.data(), x.size() * 4);
    XDS_RETURN_IF_ERROR(ex->dispatch(3, in.ids, in.w, testing::make_map(c), 1));
    f32_experts(c, f.rank(), *ex, ex->expert_out_f32());
    std::vector<uint16_t> out16(3 * size_t(c.hidden));
    Status wrong = ex->combine(out16.data(), 1);
    if (wrong.code() != StatusCode::kInvalidArgument ||
        wrong.message().find("bf16") == std::string::npos)
      return internal_error("bf16 output of an f32 combine: {}", wrong.to_string());
    std::vector<float> out(3 * size_t(c.hidden));
    XDS_RETURN_IF_ERROR(ex->combine(out.data(), 1));  // the right form still completes
    XDS_RETURN_IF_ERROR(check_out(c, in, x, f.rank(), RowDType::kF32, out));
    return ex->finish();
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

}  // namespace
}  // namespace xds::xccl

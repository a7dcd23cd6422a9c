#include "model/grouped_experts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/int8_quant.h"
#include "model/linear_runner.h"
#include "model/local_moe.h"

namespace xds {
namespace {

constexpr int64_t kD = 24, kI = 40;

// Row-major f32 weights of one expert: gate, up [I, D], down [D, I].
struct Expert {
  std::vector<float> gate, up, down;
  MlpWeights refs() const {
    return {MatrixRef{DType::kF32, gate.data(), kI, kD}, MatrixRef{DType::kF32, up.data(), kI, kD},
            MatrixRef{DType::kF32, down.data(), kD, kI}};
  }
};

std::vector<float> random_values(int64_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<Expert> make_experts(int n, std::mt19937& rng) {
  std::vector<Expert> e(static_cast<size_t>(n));
  for (Expert& x : e) {
    x.gate = random_values(kI * kD, 0.3f, rng);
    x.up = random_values(kI * kD, 0.3f, rng);
    x.down = random_values(kD * kI, 0.3f, rng);
  }
  return e;
}

float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

// The plain reference in double: scale · down(silu(gate x) ⊙ up x). bf16: the inputs of each
// product rounded to bf16, as the fast mode states.
std::vector<double> reference(const Expert& e, const float* x, float scale, bool bf16) {
  std::vector<double> xin(kD), h(kI), out(kD);
  for (int64_t j = 0; j < kD; ++j) xin[j] = bf16 ? round_bf16(x[j]) : x[j];
  for (int64_t i = 0; i < kI; ++i) {
    double g = 0, u = 0;
    for (int64_t j = 0; j < kD; ++j) {
      g += double(e.gate[i * kD + j]) * xin[j];
      u += double(e.up[i * kD + j]) * xin[j];
    }
    const double v = g / (1.0 + std::exp(-g)) * u;
    h[i] = bf16 ? round_bf16(static_cast<float>(v)) : v;
  }
  for (int64_t o = 0; o < kD; ++o) {
    double s = 0;
    for (int64_t i = 0; i < kI; ++i) s += double(e.down[o * kI + i]) * h[i];
    out[o] = scale * s;
  }
  return out;
}

// A device holding a subset of 6 experts in 4 slots (one spare), rows given through a gather
// index into a token buffer, each row weighted: every output row against the reference.
void check_subset(ComputeDType compute, double tolerance) {
  std::mt19937 rng(11);
  const std::vector<Expert> experts = make_experts(6, rng);
  MoeWeights layer;
  for (const Expert& e : experts) layer.experts.push_back(e.refs());
  const std::vector<int32_t> logical = {4, -1, 1, 5};
  std::vector<const MlpWeights*> slots;
  ASSERT_TRUE(bind_expert_slots(layer, logical, slots).ok());
  ASSERT_EQ(slots[1], nullptr);
  EXPECT_EQ(slots[0], &layer.experts[4]);
  // Slot 0: 3 rows, 1: none, 2: 20 rows (the sgemm path of f32 row-major weights), 3: 1.
  const std::vector<int32_t> offsets = {0, 3, 3, 23, 24};
  constexpr int64_t kTokens = 9, kStride = kD + 5;
  const std::vector<float> tokens = random_values(kTokens * kStride, 1.0f, rng);
  std::vector<int32_t> gather(24);
  for (size_t i = 0; i < gather.size(); ++i)
    gather[i] = static_cast<int32_t>((i * 5 + 2) % kTokens);
  const std::vector<float> scale = random_values(24, 1.0f, rng);
  std::vector<float> out(24 * kD, -1.0f);

  ThreadPool pool(3);
  GroupedExperts ge(compute, pool);
  GroupedExpertsInput in;
  in.slots = slots;
  in.offsets = offsets;
  in.rows = tokens.data();
  in.row_stride = kStride;
  in.gather = gather.data();
  in.scale = scale.data();
  in.out = out.data();
  ASSERT_TRUE(ge.run(in).ok());
  for (size_t s = 0; s < logical.size(); ++s) {
    for (int32_t i = offsets[s]; i < offsets[s + 1]; ++i) {
      const std::vector<double> want =
          reference(experts[static_cast<size_t>(logical[s])], tokens.data() + gather[i] * kStride,
                    scale[i], compute == ComputeDType::kBF16);
      double err = 0, norm = 0;
      for (int64_t o = 0; o < kD; ++o) {
        err = std::max(err, std::abs(out[i * kD + o] - want[o]));
        norm = std::max(norm, std::abs(want[o]));
      }
      EXPECT_LE(err, tolerance * norm) << "slot " << s << " row " << i;
    }
  }
}

TEST(GroupedExperts, F32MatchesThePlainReferenceOnASubsetOfExperts) {
  check_subset(ComputeDType::kF32, 1e-5);
}

TEST(GroupedExperts, Bf16MatchesTheReferenceWithItsRoundingPoints) {
  check_subset(ComputeDType::kBF16, 2e-2);
}

// Rows sent as bf16 give exactly what the same values sent as f32 give, in either compute
// dtype; and no result depends on the thread count.
TEST(GroupedExperts, Bf16RowsEqualTheirF32ValuesAndThreadsDoNotMatter) {
  std::mt19937 rng(5);
  const std::vector<Expert> experts = make_experts(3, rng);
  std::vector<MlpWeights> w;
  for (const Expert& e : experts) w.push_back(e.refs());
  const std::vector<const MlpWeights*> slots = {&w[0], &w[1], &w[2]};
  const std::vector<int32_t> offsets = {0, 2, 19, 21};
  const std::vector<float> values = random_values(21 * kD, 1.0f, rng);
  std::vector<uint16_t> rows16(values.size());
  std::vector<float> rows32(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    rows16[i] = f32_to_bf16(values[i]);
    rows32[i] = bf16_to_f32(rows16[i]);
  }
  for (const ComputeDType compute : {ComputeDType::kF32, ComputeDType::kBF16}) {
    std::vector<float> a(21 * kD), b(21 * kD), c(21 * kD);
    ThreadPool one(1), three(3);
    GroupedExperts ga(compute, one), gb(compute, three);
    GroupedExpertsInput in;
    in.slots = slots;
    in.offsets = offsets;
    in.row_stride = kD;
    in.rows = rows32.data();
    in.out = a.data();
    ASSERT_TRUE(ga.run(in).ok());
    in.out = b.data();
    ASSERT_TRUE(gb.run(in).ok());
    in.rows = rows16.data();
    in.row_dtype = DType::kBF16;
    in.out = c.data();
    ASSERT_TRUE(gb.run(in).ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
  }
}

// W8A8 experts (the test's f32 weights quantized per row and packed): rows quantized once
// by their producer and handed over as INT8 (values, then the f32 scale at a byte offset of
// the row, as XCCL carries them) give the bits of f32 rows that the experts quantize
// themselves (the same rule, int8_quant.h: the same integers and scales). A zero row is
// included (scale 0). INT8 rows with float experts, or a scale outside the row, are errors.
TEST(GroupedExperts, Int8RowsGiveTheBitsOfF32RowsQuantizedByTheExperts) {
  std::mt19937 rng(23);
  const std::vector<Expert> experts = make_experts(3, rng);
  struct Packed {
    kernels::Int8Panels gate, up, down;
  };
  std::vector<Packed> packed;
  MoeWeights layer;
  for (const Expert& e : experts) {
    auto pack = [](const std::vector<float>& w, int64_t rows, int64_t cols) {
      const kernels::Int8Rows q = kernels::quantize_int8(w.data(), rows, cols);
      return kernels::Int8Panels::pack(q.ref());
    };
    packed.push_back({pack(e.gate, kI, kD), pack(e.up, kI, kD), pack(e.down, kD, kI)});
  }
  for (const Packed& p : packed) {
    auto ref = [](const kernels::Int8Panels& m) {
      const kernels::Int8PanelsRef r = m.ref();
      MatrixRef w{DType::kI8, r.data, r.rows, r.cols, MatrixLayout::kInt8Panels};
      w.scales = r.scale;
      w.correction = r.correction;
      return w;
    };
    layer.experts.push_back({ref(p.gate), ref(p.up), ref(p.down)});
  }
  const std::vector<int32_t> logical = {2, 0, 1};
  std::vector<const MlpWeights*> slots;
  ASSERT_TRUE(bind_expert_slots(layer, logical, slots).ok());
  const std::vector<int32_t> offsets = {0, 4, 5, 11};
  constexpr int64_t kTokens = 7, kScaleAt = (kD + 3) / 4 * 4, kRowBytes = kScaleAt + 4 + 8;
  std::vector<float> tokens = random_values(kTokens * kD, 1.0f, rng);
  for (int64_t j = 0; j < kD; ++j) tokens[3 * kD + j] = 0.0f;
  std::vector<std::byte> q(static_cast<size_t>(kTokens * kRowBytes), std::byte{0x5a});
  for (int64_t t = 0; t < kTokens; ++t) {
    std::byte* row = q.data() + t * kRowBytes;
    const float sc =
        kernels::quantize_row_int8(tokens.data() + t * kD, kD, reinterpret_cast<int8_t*>(row));
    std::memcpy(row + kScaleAt, &sc, sizeof sc);
  }
  std::vector<int32_t> gather(11);
  for (size_t i = 0; i < gather.size(); ++i) gather[i] = static_cast<int32_t>((i * 3 + 1) % kTokens);
  const std::vector<float> scale = random_values(11, 1.0f, rng);
  for (const ComputeDType compute : {ComputeDType::kF32, ComputeDType::kBF16}) {
    ThreadPool pool(2);
    GroupedExperts ge(compute, pool);
    GroupedExpertsInput in;
    in.slots = slots;
    in.offsets = offsets;
    in.gather = gather.data();
    in.scale = scale.data();
    std::vector<float> from_f32(11 * kD, -1.0f), from_int8(11 * kD, -2.0f);
    in.rows = tokens.data();
    in.row_stride = kD;
    in.out = from_f32.data();
    ASSERT_TRUE(ge.run(in).ok());
    in.rows = q.data();
    in.row_dtype = DType::kI8;
    in.row_stride = kRowBytes;
    in.int8_scale_offset = kScaleAt;
    in.out = from_int8.data();
    ASSERT_TRUE(ge.run(in).ok());
    ASSERT_EQ(std::memcmp(from_f32.data(), from_int8.data(), sizeof(float) * from_f32.size()), 0);
    // Not trivially equal: the experts' outputs are not the fill values, and the zero row
    // gives zeros.
    for (size_t i = 0; i < gather.size(); ++i) {
      bool nonzero = false;
      for (int64_t o = 0; o < kD; ++o) nonzero |= from_int8[i * kD + o] != 0.0f;
      EXPECT_EQ(nonzero, gather[i] != 3) << "row " << i;
    }
    in.int8_scale_offset = kRowBytes - 2;
    const Status bad_scale = ge.run(in);
    EXPECT_NE(bad_scale.message().find("scale at"), std::string::npos) << bad_scale.message();
    in.int8_scale_offset = kScaleAt;
    MoeWeights floats;
    for (const Expert& e : experts) floats.experts.push_back(e.refs());
    std::vector<const MlpWeights*> float_slots;
    ASSERT_TRUE(bind_expert_slots(floats, logical, float_slots).ok());
    in.slots = float_slots;
    const Status float_experts = ge.run(in);
    EXPECT_NE(float_experts.message().find("INT8 rows need W8A8 experts"), std::string::npos)
        << float_experts.message();
  }
}

TEST(GroupedExperts, InconsistentInputIsAnErrorNamingTheField) {
  std::mt19937 rng(3);
  const std::vector<Expert> experts = make_experts(1, rng);
  const MlpWeights w = experts[0].refs();
  const std::vector<const MlpWeights*> slots = {&w, nullptr};
  std::vector<float> rows(4 * kD), out(4 * kD);
  ThreadPool pool(1);
  GroupedExperts ge(ComputeDType::kF32, pool);
  auto run = [&](std::vector<int32_t> offsets) {
    GroupedExpertsInput in;
    in.slots = slots;
    in.offsets = offsets;
    in.rows = rows.data();
    in.row_stride = kD;
    in.out = out.data();
    return ge.run(in);
  };
  EXPECT_NE(run({0, 2}).message().find("2 offsets for 2 slots"), std::string::npos);
  EXPECT_NE(run({1, 2, 2}).message().find("offsets[0] is 1"), std::string::npos);
  EXPECT_NE(run({0, 3, 2}).message().find("offsets[2] = 2 < offsets[1] = 3"), std::string::npos);
  EXPECT_NE(run({0, 2, 4}).message().find("2 rows in empty slot 1"), std::string::npos);
  EXPECT_TRUE(run({0, 4, 4}).ok());
  EXPECT_TRUE(run({0, 0, 0}).ok());  // no rows: nothing to do

  MoeWeights layer;
  layer.experts.push_back(w);
  std::vector<const MlpWeights*> bound;
  const Status bad = bind_expert_slots(layer, std::vector<int32_t>{0, 1}, bound);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("expert slot 1: logical expert 1"), std::string::npos);
}

// LocalMoeExchange over GroupedExperts: out[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t])
// against the reference; n = 0 is a no-op.
TEST(LocalMoeExchange, SumsEachTokensExpertsAsTheReference) {
  std::mt19937 rng(17);
  const std::vector<Expert> experts = make_experts(5, rng);
  MoeWeights layer;
  for (const Expert& e : experts) layer.experts.push_back(e.refs());
  ThreadPool pool(2);
  LinearRunner linear(ComputeDType::kF32, pool);
  LocalMoeExchange exchange({&layer}, kD, linear);

  constexpr int64_t kN = 7, kK = 2;
  const std::vector<float> x = random_values(kN * kD, 1.0f, rng);
  const std::vector<float> gw = random_values(kN * kK, 1.0f, rng);
  std::vector<int32_t> ids(kN * kK);
  for (int64_t t = 0; t < kN; ++t) {
    ids[t * kK] = static_cast<int32_t>((t * 3) % 5);
    ids[t * kK + 1] = static_cast<int32_t>((t * 3 + 1 + t % 3) % 5);
  }
  std::vector<float> out(kN * kD, 9.0f);
  MoeExchangeInput in{0, x.data(), kN, ids.data(), gw.data(), kK, out.data()};
  ASSERT_TRUE(exchange.run(in).ok());
  for (int64_t t = 0; t < kN; ++t) {
    std::vector<double> want(kD, 0.0);
    for (int64_t j = 0; j < kK; ++j) {
      const std::vector<double> r =
          reference(experts[ids[t * kK + j]], x.data() + t * kD, gw[t * kK + j], false);
      for (int64_t o = 0; o < kD; ++o) want[o] += r[o];
    }
    for (int64_t o = 0; o < kD; ++o)
      EXPECT_NEAR(out[t * kD + o], want[o], 1e-5 * (1.0 + std::abs(want[o]))) << t << " " << o;
  }
  MoeExchangeInput none{0, nullptr, 0, nullptr, nullptr, kK, nullptr};
  EXPECT_TRUE(exchange.run(none).ok());
}

}  // namespace
}  // namespace xds

// ExpertSlotStore: a redundant slot holds a byte-for-byte copy of every array an expert's
// matrices point to, in each weight layout (sizes worked out by hand from tensor/matrix.h).
#include "engine/expert_slots.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace xds::engine {
namespace {

// Owns the arrays of hand-built matrices: random bytes, so a copy from the wrong place or of
// the wrong length shows.
class Arrays {
 public:
  const void* make(int64_t bytes) {
    std::vector<uint8_t>& v = store_.emplace_back(size_t(bytes));
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng_());
    return v.data();
  }

 private:
  std::deque<std::vector<uint8_t>> store_;
  std::mt19937 rng_{7};
};

// The arrays of one matrix and their sizes, as the test derives them.
struct Expected {
  MatrixRef m;
  int64_t data = 0, scales = 0, zero = 0, correction = 0;
};

// 40 x 256 matrices (40 rows: not a multiple of 16 or 32, so every padding rule shows).
constexpr int64_t kRows = 40, kCols = 256;

Expected bf16_rows(Arrays& a) {
  Expected e{{DType::kBF16, nullptr, kRows, kCols, MatrixLayout::kRows}, kRows * kCols * 2};
  e.m.data = a.make(e.data);
  return e;
}

// FP8 panels, blocks of 128 columns: 3 panels -> 4 stored, 2 scale blocks each.
Expected fp8_panels(Arrays& a) {
  Expected e{{DType::kF8E4M3, nullptr, kRows, kCols, MatrixLayout::kPanels16}, 4 * 16 * kCols,
             4 * 2 * 4};
  e.m.scale_shift = 7;
  e.m.data = a.make(e.data);
  e.m.scales = static_cast<const float*>(a.make(e.scales));
  return e;
}

// Int8 panels: rows padded to 64; a scale and a correction per stored row.
Expected int8_panels(Arrays& a) {
  Expected e{{DType::kI8, nullptr, kRows, kCols, MatrixLayout::kInt8Panels}, 64 * kCols, 64 * 4,
             0, 64 * 4};
  e.m.data = a.make(e.data);
  e.m.scales = static_cast<const float*>(a.make(e.scales));
  e.m.correction = static_cast<const int32_t*>(a.make(e.correction));
  return e;
}

// Int4 panels, groups of 64 (4 groups): half a byte a weight over 64 stored rows; asymmetric
// with a column order, or symmetric without.
Expected int4_panels(Arrays& a, bool asym_with_order) {
  Expected e{{DType::kU8, nullptr, kRows, kCols, MatrixLayout::kInt4Panels}, 64 * kCols / 2,
             64 * 4 * 4};
  e.m.group_cols = 64;
  e.m.int8_activations = true;
  e.m.data = a.make(e.data);
  e.m.scales = static_cast<const float*>(a.make(e.scales));
  if (asym_with_order) {
    e.zero = 64 * 4;
    e.correction = kCols * 4;
    e.m.zero = static_cast<const uint8_t*>(a.make(e.zero));
    e.m.correction = static_cast<const int32_t*>(a.make(e.correction));
  }
  return e;
}

void expect_copied(const Expected& src, const MatrixRef& slot, const char* what) {
  auto same = [&](const void* a, const void* b, int64_t n, const char* part) {
    if (n == 0) {
      EXPECT_EQ(b, nullptr) << what << " " << part;
      return;
    }
    ASSERT_NE(b, nullptr) << what << " " << part;
    EXPECT_NE(a, b) << what << " " << part << " must be a copy, not the source";
    EXPECT_EQ(std::memcmp(a, b, size_t(n)), 0) << what << " " << part;
  };
  same(src.m.data, slot.data, src.data, "payload");
  same(src.m.scales, slot.scales, src.scales, "scales");
  same(src.m.zero, slot.zero, src.zero, "zero points");
  same(src.m.correction, slot.correction, src.correction, "correction");
  EXPECT_EQ(slot.rows, src.m.rows);
  EXPECT_EQ(slot.group_cols, src.m.group_cols);
  EXPECT_EQ(slot.int8_activations, src.m.int8_activations);
}

class ExpertSlots : public ::testing::TestWithParam<int> {
 protected:
  Expected make(Arrays& a) {
    switch (GetParam()) {
      case 0: return bf16_rows(a);
      case 1: return fp8_panels(a);
      case 2: return int8_panels(a);
      case 3: return int4_panels(a, true);
      default: return int4_panels(a, false);
    }
  }
};

TEST_P(ExpertSlots, ASlotHoldsACopyOfEveryArray) {
  Arrays a;
  MoeWeights layer;
  std::vector<std::array<Expected, 3>> experts;
  for (int e = 0; e < 3; ++e) {
    experts.push_back({make(a), make(a), make(a)});
    layer.experts.push_back({experts[e][0].m, experts[e][1].m, experts[e][2].m});
  }
  auto store = ExpertSlotStore::create({&layer, &layer}, 2);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  // Expert 2 into slot 1 of row 1, expert 1 into slot 0 of row 1: neighbours must not overlap.
  ASSERT_TRUE((*store)->stage(1, 1, 2, layer.experts[2]).ok());
  ASSERT_TRUE((*store)->stage(1, 0, 1, layer.experts[1]).ok());
  int logical = -1;
  auto w2 = (*store)->commit(1, 1, &logical);
  ASSERT_TRUE(w2.ok()) << w2.status().to_string();
  EXPECT_EQ(logical, 2);
  auto w1 = (*store)->commit(1, 0, &logical);
  ASSERT_TRUE(w1.ok()) << w1.status().to_string();
  for (const auto& [w, e] : {std::pair{*w2, 2}, std::pair{*w1, 1}}) {
    expect_copied(experts[e][0], w->gate_proj, "gate");
    expect_copied(experts[e][1], w->up_proj, "up");
    expect_copied(experts[e][2], w->down_proj, "down");
  }
}

std::string layout_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"Bf16Rows", "Fp8Panels", "Int8Panels", "Int4AsymOrdered",
                                       "Int4Sym"};
  return kNames[info.param];
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertSlots, ::testing::Range(0, 5), layout_name);

// An expert whose matrices have other arrays than expert 0's (here: zero points) cannot take
// a slot shaped after expert 0.
TEST(ExpertSlotsShape, AnExpertWithOtherArraysIsRefused) {
  Arrays a;
  MoeWeights layer;
  const Expected sym = int4_panels(a, false), asym = int4_panels(a, true);
  layer.experts.push_back({sym.m, sym.m, sym.m});
  layer.experts.push_back({asym.m, sym.m, sym.m});
  auto store = ExpertSlotStore::create({&layer}, 1);
  ASSERT_TRUE(store.ok());
  const Status st = (*store)->stage(0, 0, 1, layer.experts[1]);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("expert 1 of row 0 differs in shape"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace xds::engine

#include <gtest/gtest.h>

#include <cmath>

#include "quant/calibration.h"

namespace xds {

// Σ x xᵀ and max |x| against a plain loop, over two calls with a row stride.
TEST(LinearStats, HessianAndMaximaByHand) {
  LinearStats s(3);
  const float a[] = {1, -2, 3, 99, 0.5f, 4, -1, 99};  // 2 rows of 3, stride 4
  const float b[] = {-6, 1, 2};
  s.add(a, 2, 4);
  s.add(b, 1, 3);
  s.finish();
  const float rows[3][3] = {{1, -2, 3}, {0.5f, 4, -1}, {-6, 1, 2}};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      double h = 0.0;
      for (const auto& r : rows) h += double(r[i]) * r[j];
      EXPECT_DOUBLE_EQ(s.hessian[i * 3 + j], h) << i << "," << j;
    }
  }
  EXPECT_EQ(s.act_max, (std::vector<float>{6.0f, 4.0f, 3.0f}));
  EXPECT_EQ(s.tokens, 3);
}

}  // namespace xds

// The register transpose against the definition, element by element.
#include "kernels/cpu/transpose16.h"

#include <gtest/gtest.h>

namespace xds::kernels {
namespace {

#if defined(__AVX512F__)
TEST(Transpose16, ColumnsBecomeRows) {
  alignas(64) float in[16][16], got[16][16];
  for (int j = 0; j < 16; ++j)
    for (int c = 0; c < 16; ++c) in[j][c] = static_cast<float>(100 * j + c);
  __m512 r[16], out[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_load_ps(in[j]);
  transpose_16x16(r, out);
  for (int c = 0; c < 16; ++c) _mm512_store_ps(got[c], out[c]);
  for (int c = 0; c < 16; ++c)
    for (int j = 0; j < 16; ++j) ASSERT_EQ(got[c][j], in[j][c]) << "c=" << c << " j=" << j;
}
#endif

}  // namespace
}  // namespace xds::kernels

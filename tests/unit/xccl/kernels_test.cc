// Memory kernels of the shm transport and combine, against plain loops written here:
// copy_bytes (AVX2 loop for mid sizes, memcpy elsewhere) and weighted_sum_bf16 (64-column AVX2
// steps, 16-column steps, scalar tail).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "xccl/rowops.h"
#include "xccl/transport.h"

namespace xds::xccl {
namespace {

uint64_t next(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

TEST(XcclKernels, CopyBytesCopiesExactlyTheRangeAtEveryAlignment) {
  // Sizes around the vector loop's floor (2 KB), its 128-byte steps and its ceiling (1 MB);
  // destination offsets include 16 (the distance glibc's rep movsb is slow at).
  const std::vector<uint64_t> sizes = {0,    1,    63,   64,        127,          128,
                                       129,  2047, 2048, 2049,      4096 + 16,    65536 + 5,
                                       (1u << 20) - 1,   (1u << 20), (1u << 20) + 3};
  const uint64_t pad = 256, cap = (1u << 20) + 3 + 2 * pad;
  std::vector<uint8_t> src(cap), dst(cap);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (auto& b : src) b = uint8_t(next(seed));
  for (uint64_t n : sizes)
    for (uint64_t doff : {0u, 1u, 16u, 63u})
      for (uint64_t soff : {0u, 5u, 16u, 48u}) {
        uint8_t* d = dst.data() + pad + doff;
        const uint8_t* s = src.data() + pad + soff;
        std::fill(d - 64, d + n + 64, uint8_t(0xA5));
        copy_bytes(d, s, n);
        const std::string what = "n " + std::to_string(n) + " dst offset " +
                                 std::to_string(doff) + " src offset " + std::to_string(soff);
        if (n != 0 && std::memcmp(d, s, n) != 0) {
          for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(d[i], s[i]) << what << " byte " << i;
        }
        for (int g = 1; g <= 64; ++g) {  // nothing written before or after the range
          ASSERT_EQ(d[-g], 0xA5) << what << " guard before " << g;
          ASSERT_EQ(d[n + uint64_t(g) - 1], 0xA5) << what << " guard after " << g;
        }
      }
}

// The documented semantics, written out: f32 fused multiply-adds in ascending j from +0, then
// bf16 round to nearest even (a NaN stays a NaN).
uint16_t plain_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float plain_float(uint16_t b) {
  return std::bit_cast<float>(uint32_t(b) << 16);
}

TEST(XcclKernels, WeightedSumIsTheScalarFmaLoopBitForBit) {
  uint64_t seed = 12345;
  // Raw bf16 patterns: mostly ordinary values of mixed magnitude, some -0, subnormals, huge
  // values (sums overflow to inf), infinities; NaNs only where asked.
  auto value = [&](bool allow_nan) -> uint16_t {
    const uint64_t r = next(seed);
    switch (r % 16) {
      case 0: return 0x8000;                              // -0
      case 1: return uint16_t(0x0001 + (r >> 8) % 0x7f);  // subnormal
      case 2: return uint16_t(0x7f00 + (r >> 8) % 0x7f);  // near the top of the range
      case 3: return (r >> 8) & 1 ? 0x7f80 : 0xff80;      // +-inf
      case 4: return allow_nan ? 0x7fc1 : 0x3f80;         // a NaN (or 1.0)
      default: return uint16_t(((r >> 8) & 0x8000) | (0x3800 + (r >> 20) % 0x0a00));
    }
  };
  // Exact ties first: x0 in [1, 2) (or its negative) plus half its bf16 ulp (2^-8) lands
  // exactly halfway; round to nearest even keeps x0 when its last bit is 0, else goes up.
  {
    const int hidden = 64 * 3 + 16 + 5;
    std::vector<uint16_t> x0(size_t(hidden), 0), x1(size_t(hidden), 0), out(size_t(hidden), 0);
    for (int h = 0; h < hidden; ++h) {
      const uint16_t sign = h % 3 == 0 ? 0x8000 : 0;
      x0[size_t(h)] = uint16_t(sign | (0x3f80 + h % 128));
      x1[size_t(h)] = uint16_t(sign | 0x3b80);  // +-2^-8
    }
    const uint16_t* rows[2] = {x0.data(), x1.data()};
    const float w[2] = {1.f, 1.f};
    weighted_sum_bf16(rows, w, 2, hidden, out.data());
    for (int h = 0; h < hidden; ++h) {
      const uint16_t mant = x0[size_t(h)] & 0x7f;
      const uint16_t want = (mant & 1) ? uint16_t(x0[size_t(h)] + 1) : x0[size_t(h)];
      ASSERT_EQ(out[size_t(h)], want) << "tie at column " << h;
    }
  }
  for (int hidden : {1, 15, 16, 17, 63, 64, 65, 80, 127, 128, 200, 7168 + 17}) {
    for (int n : {0, 1, 2, 4, 5, 9}) {
      for (bool nans : {false, true}) {
        std::vector<std::vector<uint16_t>> rows(size_t(n), std::vector<uint16_t>(size_t(hidden), 0));
        std::vector<const uint16_t*> ptr;
        std::vector<float> w;
        for (int j = 0; j < n; ++j) {
          for (auto& x : rows[size_t(j)]) x = value(nans && next(seed) % 8 == 0);
          ptr.push_back(rows[size_t(j)].data());
          w.push_back(float(int(next(seed) % 2001) - 1000) / 997.f);
        }
        std::vector<uint16_t> out(size_t(hidden), 0x1234);
        weighted_sum_bf16(ptr.data(), w.data(), n, hidden, out.data());
        for (int h = 0; h < hidden; ++h) {
          float acc = 0.f;
          for (int j = 0; j < n; ++j)
            acc = std::fma(w[size_t(j)], plain_float(rows[size_t(j)][size_t(h)]), acc);
          const uint16_t want = plain_bf16(acc), got = out[size_t(h)];
          if (std::isnan(acc)) {
            ASSERT_TRUE(std::isnan(plain_float(got)))
                << "hidden " << hidden << " terms " << n << " column " << h;
          } else {
            ASSERT_EQ(got, want) << "hidden " << hidden << " terms " << n << " column " << h
                                 << " sum " << acc;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace xds::xccl

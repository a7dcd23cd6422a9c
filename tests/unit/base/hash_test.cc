// fnv1a64 against an independent computation: the FNV-1a steps (xor the byte, multiply by
// 1099511628211 mod 2^64) from its offset basis, done by hand in Python's integers.
#include "base/hash.h"

#include <gtest/gtest.h>

namespace xds {
namespace {

TEST(Hash, Fnv1a64MatchesAnIndependentComputation) {
  static_assert(fnv1a64("") == 1469598103934665603ull);  // the offset basis
  EXPECT_EQ(fnv1a64("a"), 0x44bd8ad473cd9906ull);
  EXPECT_EQ(fnv1a64("foobar"), 0x88fad7c0a8ff07f2ull);
}

}  // namespace
}  // namespace xds

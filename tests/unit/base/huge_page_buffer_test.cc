// HugePageBuffer: zero-filled, writable to its last byte, moves without copying or
// double-freeing, and refuses a size no mapping can hold with std::bad_alloc.
#include "base/huge_page_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <utility>

namespace xds {
namespace {

TEST(HugePageBuffer, IsZeroFilledAndWritable) {
  const size_t bytes = (size_t{5} << 20) + 12345;  // not a multiple of 2 MB
  HugePageBuffer b(bytes);
  ASSERT_NE(b.as<char>(), nullptr);
  EXPECT_EQ(b.size(), bytes);
  const auto* u = b.as<uint8_t>();
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; ++i) nonzero += u[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  b.as<uint8_t>()[bytes - 1] = 7;
  b.as<uint8_t>()[0] = 9;
  EXPECT_EQ(b.as<uint8_t>()[bytes - 1], 7);
  EXPECT_EQ(b.as<uint8_t>()[0], 9);
}

TEST(HugePageBuffer, MovesOwnership) {
  HugePageBuffer a(4096);
  a.as<int>()[10] = 42;
  int* at = a.as<int>();
  HugePageBuffer b(std::move(a));
  EXPECT_EQ(b.as<int>(), at);
  EXPECT_EQ(b.as<int>()[10], 42);
  EXPECT_EQ(a.as<int>(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0u);          // NOLINT(bugprone-use-after-move)
  HugePageBuffer c(100);
  c = std::move(b);  // c's own mapping is released, b's taken over
  EXPECT_EQ(c.as<int>(), at);
  EXPECT_EQ(c.as<int>()[10], 42);
  EXPECT_EQ(b.as<int>(), nullptr);  // NOLINT(bugprone-use-after-move)
}

TEST(HugePageBuffer, EmptyAndImpossibleSizes) {
  HugePageBuffer empty(0);
  EXPECT_EQ(empty.as<char>(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_THROW(HugePageBuffer(SIZE_MAX - 100), std::bad_alloc);
  EXPECT_THROW(HugePageBuffer(size_t{1} << 62), std::bad_alloc);  // 4 EiB: no mapping holds it
}

}  // namespace
}  // namespace xds

#include "base/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace xds {
namespace {

std::string nested(int levels, char open, char close) {
  return std::string(static_cast<size_t>(levels), open) +
         std::string(static_cast<size_t>(levels), close);
}

TEST(JsonDepth, CountsArraysAndObjectsUpToTheLimit) {
  EXPECT_FALSE(json_nesting_exceeds("{}", 1));
  EXPECT_TRUE(json_nesting_exceeds("[[]]", 1));
  EXPECT_FALSE(json_nesting_exceeds(nested(128, '[', ']'), 128));
  EXPECT_TRUE(json_nesting_exceeds(nested(129, '[', ']'), 128));
  EXPECT_FALSE(json_nesting_exceeds(R"({"a": [1, {"b": [2]}], "c": {}})", 4));
  EXPECT_TRUE(json_nesting_exceeds(R"({"a": [1, {"b": [2]}], "c": {}})", 3));
  // Siblings do not add up.
  EXPECT_FALSE(json_nesting_exceeds("[[], [], [[]], []]", 3));
}

TEST(JsonDepth, IgnoresBracketsInStringsAndEscapedQuotes) {
  EXPECT_FALSE(json_nesting_exceeds(R"(["[[[[", "{{{{"])", 1));
  EXPECT_FALSE(json_nesting_exceeds(R"(["a\"[[[[", "\\"])", 1));
  EXPECT_TRUE(json_nesting_exceeds(R"(["\\", [[]]])", 2));
}

TEST(JsonDepth, StopsAtTheLimitOnHugeInput) {
  // 4 million levels: answered after the first 129 characters.
  EXPECT_TRUE(json_nesting_exceeds(std::string(4'000'000, '['), 128));
}

}  // namespace
}  // namespace xds

// Stop strings: hand-derived cases, and random splits of random texts against a plain
// reference (the text before the earliest occurrence of any stop string, found in one piece).
#include "output/stop_matcher.h"

#include <gtest/gtest.h>

#include "output_test_util.h"

namespace xds::output {
namespace {

struct Fed {
  std::string text;
  bool stopped = false;
  std::string matched;
};

Fed feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  Fed out;
  for (const std::string& p : pieces) {
    StopPush s = m.push(p);
    EXPECT_FALSE(out.stopped && !s.text.empty()) << "text after the stop";
    out.text += s.text;
    if (s.stopped) {
      out.stopped = true;
      out.matched = s.matched;
    }
  }
  out.text += m.finish();
  return out;
}

TEST(StopMatcher, AcrossTokenBoundaries) {
  StopMatcher m({"\n\nUser:"});
  StopPush a = m.push("Hello.\n");
  EXPECT_EQ(a.text, "Hello.");  // "\n" may start the stop string
  EXPECT_FALSE(a.stopped);
  StopPush b = m.push("\nUs");
  EXPECT_EQ(b.text, "");
  EXPECT_EQ(m.held(), 4u);
  StopPush c = m.push("er: hi");
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(c.matched, "\n\nUser:");
  EXPECT_EQ(m.push("more").text, "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, PrefixThatDoesNotMatch) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("a ST").text, "a ");
  EXPECT_EQ(m.push("O").text, "");
  StopPush s = m.push("P!");  // "STOP" completes
  EXPECT_TRUE(s.stopped);
  StopMatcher m2({"STOP"});
  EXPECT_EQ(m2.push("a ST").text, "a ");
  EXPECT_EQ(m2.push("OMP").text, "STOMP");  // turned out not to match: released whole
  EXPECT_EQ(m2.push("S").text, "");
  EXPECT_EQ(m2.finish(), "S");  // the end releases a held prefix
}

TEST(StopMatcher, OverlappingCandidates) {
  // "aab": after "aa" the held text must allow the match to start at the second 'a'.
  StopMatcher m({"aab"});
  EXPECT_EQ(m.push("xa").text, "x");
  EXPECT_EQ(m.push("a").text, "");
  EXPECT_EQ(m.push("a").text, "a");  // "aaa": the first 'a' can no longer start a match
  StopPush s = m.push("b");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "");
}

TEST(StopMatcher, SeveralStopStringsEarliestWins) {
  StopMatcher m({"world", "lo w", "xyz"});
  StopPush s = m.push("hello world");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "hel");
  EXPECT_EQ(s.matched, "lo w");
  // Holding back: the longest suffix that can start any stop string.
  StopMatcher m2({"abcd", "cde"});
  EXPECT_EQ(m2.push("zabc").text, "z");
  StopPush t = m2.push("x");  // "abcx": neither can match any more
  EXPECT_EQ(t.text, "abcx");
  EXPECT_FALSE(t.stopped);
  StopMatcher m3({"abcd", "cde"});
  EXPECT_EQ(m3.push("zab").text, "z");
  StopPush u = m3.push("cde");  // both complete; "abcd" starts first
  EXPECT_TRUE(u.stopped);
  EXPECT_EQ(u.text, "");
  EXPECT_EQ(u.matched, "abcd");
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({"", ""});
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.push("anything").text, "anything");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, MultiByteStopString) {
  StopMatcher m({"。\n"});
  EXPECT_EQ(m.push("你好。").text, "你好");
  StopPush s = m.push("\n再见");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "");
}

TEST(StopMatcher, RandomSplitsMatchOneShotReference) {
  std::mt19937 rng(7);
  const std::string alphabet = "abc\n";
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops(1 + rng() % 3);
    for (std::string& s : stops) {
      s.resize(1 + rng() % 4);
      for (char& c : s) c = alphabet[rng() % alphabet.size()];
    }
    std::string text(rng() % 30, ' ');
    for (char& c : text) c = alphabet[rng() % alphabet.size()];
    // Reference: the earliest occurrence of any stop string in the whole text.
    size_t first = std::string::npos;
    for (const std::string& s : stops) first = std::min(first, text.find(s));
    const std::string expected = first == std::string::npos ? text : text.substr(0, first);
    StopMatcher m(stops);
    const Fed got = feed(m, test::random_split(text, rng, 5));
    ASSERT_EQ(got.text, expected) << "trial " << trial;
    ASSERT_EQ(got.stopped, first != std::string::npos) << "trial " << trial;
    if (got.stopped) {
      ASSERT_EQ(text.compare(first, got.matched.size(), got.matched), 0);
    }
  }
}

TEST(StopMatcher, PartialSuffix) {
  EXPECT_EQ(partial_suffix("abc</thi", "</think>"), 5u);
  EXPECT_EQ(partial_suffix("abc</think>", "</think>"), 0u);  // whole tag: not a proper prefix
  EXPECT_EQ(partial_suffix("<", "</think>"), 1u);
  EXPECT_EQ(partial_suffix("abc", "</think>"), 0u);
  EXPECT_EQ(partial_suffix("", "x"), 0u);
  EXPECT_EQ(partial_suffix("x", ""), 0u);
}

}  // namespace
}  // namespace xds::output

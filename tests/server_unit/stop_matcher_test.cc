// StopMatcher against a brute-force reference: the text a client sees is the generated text
// up to the first stop string that completes (cut where it starts), however the text is cut
// into pieces, and nothing of a stop string is ever shown.
#include "server/stop_matcher.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

struct Outcome {
  std::string shown;
  bool matched = false;
};

// Pushes `pieces` in order, then flushes (as the server does at the end of generation).
Outcome RunMatcher(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher matcher(stops);
  Outcome out;
  for (const std::string& piece : pieces) out.shown += matcher.Push(piece);
  out.shown += matcher.Flush();
  out.matched = matcher.matched();
  return out;
}

// The reference, by brute force: generation is checked after each piece (token) arrives;
// the first time the text so far contains a stop string, it is cut where the earliest one
// starts, and nothing after is generated.
Outcome Reference(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  std::string text;
  for (const std::string& piece : pieces) {
    text += piece;
    size_t cut = std::string::npos;
    for (const std::string& stop : stops) {
      if (!stop.empty()) cut = std::min(cut, text.find(stop));
    }
    if (cut != std::string::npos) return {text.substr(0, cut), true};
  }
  return {text, false};
}

TEST(StopMatcherTest, NoStopsPassesEverythingThroughAtOnce) {
  StopMatcher matcher({});
  EXPECT_EQ(matcher.Push("Hello"), "Hello");
  EXPECT_EQ(matcher.Push(" world"), " world");
  EXPECT_EQ(matcher.Flush(), "");
  EXPECT_FALSE(matcher.matched());
}

TEST(StopMatcherTest, MatchAcrossPiecesIsCutAndNeverShown) {
  StopMatcher matcher({"lo W"});
  EXPECT_EQ(matcher.Push("Hel"), "He");   // the "l" may start "lo W"
  EXPECT_EQ(matcher.Push("lo Wo"), "l");  // "Hel" in all, then the match
  EXPECT_TRUE(matcher.matched());
  EXPECT_EQ(matcher.Push("rld"), "");
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, HoldsBackPossibleStartThenReleasesIt) {
  StopMatcher matcher({"abc"});
  EXPECT_EQ(matcher.Push("xab"), "x");  // "ab" may become "abc"
  EXPECT_EQ(matcher.Push("d"), "abd");
  EXPECT_EQ(matcher.Push("a"), "");
  EXPECT_EQ(matcher.Flush(), "a");  // the end of generation: "a" was no stop
  EXPECT_FALSE(matcher.matched());
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  EXPECT_EQ(RunMatcher({"world", "lo"}, {"hello world"}).shown, "hel");
  EXPECT_EQ(RunMatcher({"lo", "hello"}, {"hel", "lo"}).shown, "");
}

TEST(StopMatcherTest, SelfOverlappingStop) {
  const Outcome o = RunMatcher({"aab"}, {"a", "a", "a", "b", "zzz"});
  EXPECT_EQ(o.shown, "a");
  EXPECT_TRUE(o.matched);
}

TEST(StopMatcherTest, MultiByteCharactersAreHeldWhole) {
  StopMatcher matcher({"\xC3\xA9!"});  // "é!"
  EXPECT_EQ(matcher.Push("caf\xC3\xA9"), "caf");
  EXPECT_EQ(matcher.Push("?"), "\xC3\xA9?");
  EXPECT_EQ(matcher.Push("\xC3\xA9!"), "");
  EXPECT_TRUE(matcher.matched());
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  EXPECT_EQ(RunMatcher({""}, {"abc"}).shown, "abc");
}

TEST(StopMatcherTest, RandomTextsAndCutsAgreeWithReference) {
  std::mt19937 rng(1234);
  auto random_string = [&](int min_len, int max_len) {
    std::string s(std::uniform_int_distribution<int>(min_len, max_len)(rng), 'a');
    for (char& c : s) c = "abc"[std::uniform_int_distribution<int>(0, 2)(rng)];
    return s;
  };
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<std::string> stops;
    const int num_stops = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int i = 0; i < num_stops; ++i) stops.push_back(random_string(1, 4));
    const std::string text = random_string(0, 24);
    // Random cut into pieces, empty pieces included.
    std::vector<std::string> pieces;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t n = std::uniform_int_distribution<size_t>(0, 4)(rng);
      pieces.push_back(text.substr(pos, n));
      pos += n;
    }
    const Outcome got = RunMatcher(stops, pieces);
    const Outcome want = Reference(stops, pieces);
    ASSERT_EQ(got.shown, want.shown)
        << "text " << text << ", stops " << testing::PrintToString(stops) << ", pieces "
        << testing::PrintToString(pieces);
    ASSERT_EQ(got.matched, want.matched) << "text " << text;
  }
}

TEST(StopMatcherTest, ShowsEverythingThatCannotStartAStop) {
  // Text is never held back longer than it can still become a stop string.
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.Push("a S"), "a ");
  EXPECT_EQ(matcher.Push("T"), "");
  EXPECT_EQ(matcher.Push("x"), "STx");
}

}  // namespace
}  // namespace ridgeserve

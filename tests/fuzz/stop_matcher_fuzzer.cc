// Stop matcher (server/stop_matcher.*) against a plain reference: after every piece, the text
// shown so far must be what searching the whole text so far for the earliest stop string
// gives, and what is held back must be a proper prefix of a stop string.
//
// Input: byte 0 % 4 = number of stop strings; the rest cut at '\0' gives the stop strings,
// then the pieces pushed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/stop_matcher.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  if (size == 0) return 0;
  const size_t num_stops = data[0] % 4;
  std::vector<std::string_view> parts =
      fuzz::Split(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
                  std::string_view("\0", 1));
  std::vector<std::string> stops;
  size_t next = 0;
  for (; next < parts.size() && next < num_stops; ++next) stops.emplace_back(parts[next]);
  size_t longest = 0;
  for (const std::string& s : stops) longest = std::max(longest, s.size());

  StopMatcher matcher(stops);
  std::string text;   // everything pushed
  std::string shown;  // everything returned
  bool matched = false;
  for (; next < parts.size(); ++next) {
    text += parts[next];
    std::string out = matcher.Push(parts[next]);
    if (matched && !out.empty()) fuzz::Fail("text returned after the match");
    shown += out;
    size_t earliest = std::string::npos;
    for (const std::string& s : stops) {
      if (!s.empty()) earliest = std::min(earliest, text.find(s));
    }
    if (!matched && earliest != std::string::npos) {
      matched = true;
      if (shown != text.substr(0, earliest)) fuzz::Fail("the cut is not at the earliest stop");
    }
    if (matcher.matched() != matched) fuzz::Fail("matched() disagrees with the reference");
    if (!matched) {
      if (text.compare(0, shown.size(), shown) != 0) fuzz::Fail("shown text is not the text");
      std::string_view held = std::string_view(text).substr(shown.size());
      if (!held.empty()) {
        bool is_prefix = false;
        for (const std::string& s : stops) {
          is_prefix |= held.size() < s.size() && s.compare(0, held.size(), held) == 0;
        }
        if (!is_prefix) fuzz::Fail("held-back text is no stop string's start");
      }
      if (held.size() >= std::max<size_t>(longest, 1)) fuzz::Fail("held back too much");
    }
  }
  std::string rest = matcher.Flush();
  if (matched && !rest.empty()) fuzz::Fail("Flush returned text after the match");
  if (!matched && shown + rest != text) fuzz::Fail("Flush lost text");
  return 0;
}

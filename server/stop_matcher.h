// Stop strings over streamed text, across token boundaries: text that could still be the
// start of a stop string is held back until the next piece decides it, so no client ever sees
// part of a stop string. Text is checked as each piece arrives: the first time the text so
// far contains a stop string, it is cut where the earliest one starts (the stop string is not
// returned) and everything after is dropped.
//
// Input must be whole UTF-8 characters (StreamDecoder output) and stop strings valid UTF-8;
// then everything returned is whole characters too: a held-back suffix equals the start of a
// stop string, so it begins on a character boundary.
//
// Threading: one instance per request, used by one thread at a time.
#ifndef RIDGESERVE_SERVER_STOP_MATCHER_H_
#define RIDGESERVE_SERVER_STOP_MATCHER_H_

#include <string>
#include <string_view>
#include <vector>

namespace ridgeserve {

class StopMatcher {
 public:
  // Empty `stops`: every Push returns its input at once. Empty strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends `text` and returns what is now safe to show. After a match (matched() is true)
  // returns only the text before the stop string, once, and then nothing.
  std::string Push(std::string_view text);
  // The end of generation without a match: the held-back text (which is then no stop
  // string's start but the generation's end). Empty after a match.
  std::string Flush();

  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // tail that is a proper prefix of some stop string
  bool matched_ = false;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_STOP_MATCHER_H_

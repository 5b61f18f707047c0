#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace ridgeserve {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::Push(std::string_view text) {
  if (matched_) return "";
  if (stops_.empty()) return std::string(text);
  held_.append(text);

  // Any occurrence lies wholly inside held_: everything emitted earlier was checked not to
  // start one (see below), so the earliest match is the one to cut at.
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) {
    cut = std::min(cut, held_.find(stop));
  }
  if (cut != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }

  // Keep the longest suffix that is a proper prefix of a stop string: it may still grow into
  // a match. Everything before it cannot start one.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, held_.size());
    for (size_t k = longest; k > keep; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(stop).substr(0, k)) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace ridgeserve

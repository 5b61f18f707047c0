#include "engine/tokenizer/utf8.h"

#include <cstdint>

namespace ridgeserve {
namespace {

// Length of the valid sequence starting at `lead` (continuation bytes needed) and the
// allowed range of the first continuation byte, per the Unicode well-formed table
// (excludes overlongs, surrogates and code points above U+10FFFF). -1: not a lead byte.
struct LeadInfo {
  int continuation_bytes;
  uint8_t first_lo;
  uint8_t first_hi;
};

LeadInfo Lead(uint8_t c) {
  if (c < 0x80) return {0, 0, 0};
  if (c >= 0xC2 && c <= 0xDF) return {1, 0x80, 0xBF};
  if (c == 0xE0) return {2, 0xA0, 0xBF};
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return {2, 0x80, 0xBF};
  if (c == 0xED) return {2, 0x80, 0x9F};
  if (c == 0xF0) return {3, 0x90, 0xBF};
  if (c >= 0xF1 && c <= 0xF3) return {3, 0x80, 0xBF};
  if (c == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

}  // namespace

size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = static_cast<uint8_t>(bytes[i]);
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const LeadInfo lead = Lead(c);
    if (lead.continuation_bytes < 0) {
      out->append(kUtf8Replacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < lead.continuation_bytes && j < n) {
      const uint8_t d = static_cast<uint8_t>(bytes[j]);
      const uint8_t lo = got == 0 ? lead.first_lo : 0x80;
      const uint8_t hi = got == 0 ? lead.first_hi : 0xBF;
      if (d < lo || d > hi) break;
      ++j;
      ++got;
    }
    if (got == lead.continuation_bytes) {
      out->append(bytes.substr(i, j - i));
    } else if (j == n && !final) {
      return i;  // a valid prefix cut by the end of input: the next bytes may complete it
    } else {
      out->append(kUtf8Replacement);
    }
    i = j;
  }
  return n;
}

bool IsValidUtf8(std::string_view bytes) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = static_cast<uint8_t>(bytes[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const LeadInfo lead = Lead(c);
    if (lead.continuation_bytes < 0 || n - i <= static_cast<size_t>(lead.continuation_bytes)) {
      return false;
    }
    for (int k = 1; k <= lead.continuation_bytes; ++k) {
      const uint8_t d = static_cast<uint8_t>(bytes[i + k]);
      const uint8_t lo = k == 1 ? lead.first_lo : 0x80;
      const uint8_t hi = k == 1 ? lead.first_hi : 0xBF;
      if (d < lo || d > hi) return false;
    }
    i += lead.continuation_bytes + 1;
  }
  return true;
}

size_t Utf8CharLength(std::string_view bytes) {
  const LeadInfo lead = Lead(static_cast<uint8_t>(bytes[0]));
  if (lead.continuation_bytes <= 0) return 1;
  const size_t len = static_cast<size_t>(lead.continuation_bytes) + 1;
  return len <= bytes.size() ? len : 1;
}

}  // namespace ridgeserve

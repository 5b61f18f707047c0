#include "engine/tokenizer/byte_level.h"

#include <array>

namespace ridgeserve {
namespace {

// Highest code point the mapping uses: 0x100 + 68 - 1.
constexpr uint32_t kMaxMappedCodePoint = 0x143;

struct Tables {
  // UTF-8 (2 bytes at most) of the code point for each byte.
  std::array<std::array<char, 2>, 256> utf8{};
  std::array<uint8_t, 256> utf8_len{};
  // Code point -> byte, -1 where the code point is not in the mapping.
  std::array<int16_t, kMaxMappedCodePoint + 1> byte_of{};
};

const Tables& GetTables() {
  static const Tables* const tables = [] {
    auto* t = new Tables();
    t->byte_of.fill(-1);
    uint32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next_extra++;
      t->byte_of[cp] = static_cast<int16_t>(b);
      if (cp < 0x80) {
        t->utf8[b][0] = static_cast<char>(cp);
        t->utf8_len[b] = 1;
      } else {
        t->utf8[b][0] = static_cast<char>(0xC0 | (cp >> 6));
        t->utf8[b][1] = static_cast<char>(0x80 | (cp & 0x3F));
        t->utf8_len[b] = 2;
      }
    }
    return t;
  }();
  return *tables;
}

}  // namespace

std::string_view ByteLevelChar(uint8_t byte) {
  const Tables& t = GetTables();
  return std::string_view(t.utf8[byte].data(), t.utf8_len[byte]);
}

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char c : bytes) {
    const uint8_t b = static_cast<uint8_t>(c);
    out->append(t.utf8[b].data(), t.utf8_len[b]);
  }
}

std::optional<std::string> ByteLevelToBytes(std::string_view text) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t c = static_cast<uint8_t>(text[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;  // 3- and 4-byte characters are all outside the mapping
    }
    if (cp > kMaxMappedCodePoint || t.byte_of[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte_of[cp]));
  }
  return out;
}

}  // namespace ridgeserve

// UTF-8 helpers shared by the tokenizer and the streaming detokenizer.
#ifndef RIDGESERVE_ENGINE_TOKENIZER_UTF8_H_
#define RIDGESERVE_ENGINE_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace ridgeserve {

inline constexpr std::string_view kUtf8Replacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends `bytes` to `out` as valid UTF-8, replacing each maximal invalid subpart with one
// U+FFFD (the Unicode "maximal subpart" practice, as Rust's String::from_utf8_lossy and
// Python's errors="replace" do). When `final` is false, a trailing prefix of a sequence that
// could still become valid is left unconsumed. Returns the number of bytes consumed.
size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out);

bool IsValidUtf8(std::string_view bytes);

// Length in bytes (1-4) of the UTF-8 character starting at `bytes[0]`, assuming valid input;
// 1 for a byte that cannot start a character. `bytes` must not be empty.
size_t Utf8CharLength(std::string_view bytes);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_UTF8_H_

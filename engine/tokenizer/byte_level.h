// GPT-2's byte <-> unicode mapping: byte-level BPE vocabularies store every byte as a
// printable code point (bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to themselves, the
// other 68 to U+0100..U+0143 in byte order), so " hello" is stored as "Ġhello".
#ifndef RIDGESERVE_ENGINE_TOKENIZER_BYTE_LEVEL_H_
#define RIDGESERVE_ENGINE_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ridgeserve {

// UTF-8 of the code point that stands for `byte`.
std::string_view ByteLevelChar(uint8_t byte);

// Appends the byte-level form of raw `bytes` to `out`.
void AppendByteLevel(std::string_view bytes, std::string* out);

// Raw bytes of a byte-level string; nullopt when it holds a code point outside the mapping
// (e.g. an added token such as "<|im_start|>" is mappable, "a b" with a raw space is not).
std::optional<std::string> ByteLevelToBytes(std::string_view text);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_BYTE_LEVEL_H_

// Added tokens (special/control tokens such as "<|im_start|>" and user-defined tokens):
// found in the raw text before pre-tokenization, leftmost-longest as tokenizers'
// AddedVocabulary does, and never merged with their neighbours.
#ifndef RIDGESERVE_ENGINE_TOKENIZER_ADDED_TOKENS_H_
#define RIDGESERVE_ENGINE_TOKENIZER_ADDED_TOKENS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ridgeserve {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  // Special (control) tokens are only recognised with parse_special; the others always.
  bool special = true;
  // Absorb whitespace to the left / right of the match into the token.
  bool lstrip = false;
  bool rstrip = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Tokens with empty content are ignored.
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  // A span of the input: either plain text (id == -1) or one added token.
  struct Segment {
    std::string_view text;
    int32_t id;
  };
  // Splits `text` into plain segments and added tokens (only non-special ones unless
  // parse_special). Segments point into `text`; plain segments are never empty.
  void Split(std::string_view text, bool parse_special, std::vector<Segment>* segments) const;

 private:
  // Byte trie over the token contents. Node 0 is the root.
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node), sorted by byte
    int32_t token = -1;                                 // index into tokens_
  };
  int32_t Child(int32_t node, uint8_t byte) const;
  // Longest token at `pos` usable under `parse_special`: its index, and its length in
  // `length`; -1 when none.
  int32_t LongestAt(std::string_view text, size_t pos, bool parse_special, size_t* length) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};  // bytes that start some token: a fast skip
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_ADDED_TOKENS_H_

#include "engine/tokenizer/added_tokens.h"

#include <algorithm>

namespace ridgeserve {
namespace {

// Rust's char::is_whitespace for the ASCII/Latin-1 range, which is what token boundaries
// in practice hold; wider Unicode spaces are not stripped.
bool IsSpaceByte(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  nodes_.emplace_back();
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    const int32_t index = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
    int32_t node = 0;
    for (char c : token.content) {
      const uint8_t byte = static_cast<uint8_t>(c);
      int32_t child = Child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0})),
            {byte, child});
      }
      node = child;
    }
    // The same content twice: the later entry wins, as a map insert in tokenizers would.
    nodes_[node].token = index;
    first_byte_[static_cast<uint8_t>(token.content[0])] = true;
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, uint8_t byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

int32_t AddedTokenMatcher::LongestAt(std::string_view text, size_t pos, bool parse_special,
                                     size_t* length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = Child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    const int32_t token = nodes_[node].token;
    if (token >= 0 && (parse_special || !tokens_[token].special)) {
      best = token;
      *length = i + 1 - pos;
    }
  }
  return best;
}

void AddedTokenMatcher::Split(std::string_view text, bool parse_special,
                              std::vector<Segment>* segments) const {
  size_t plain_start = 0;  // start of the plain text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    const int32_t token = first_byte_[static_cast<uint8_t>(text[pos])]
                              ? LongestAt(text, pos, parse_special, &length)
                              : -1;
    if (token < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t end = pos + length;
    if (tokens_[token].lstrip) {
      while (start > plain_start && IsSpaceByte(text[start - 1])) --start;
    }
    if (tokens_[token].rstrip) {
      while (end < text.size() && IsSpaceByte(text[end])) ++end;
    }
    if (start > plain_start) {
      segments->push_back({text.substr(plain_start, start - plain_start), -1});
    }
    segments->push_back({text.substr(start, end - start), tokens_[token].id});
    plain_start = end;
    pos = end;
  }
  if (plain_start < text.size()) {
    segments->push_back({text.substr(plain_start), -1});
  }
}

}  // namespace ridgeserve

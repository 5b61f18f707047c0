#include "engine/tokenizer/bpe.h"

#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/byte_level.h"

namespace ridgeserve {

absl::StatusOr<BpeModel> BpeModel::Create(
    const std::vector<std::string>& tokens,
    const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options) {
  BpeModel model;
  model.options_ = options;
  model.token_to_id_.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].empty()) continue;
    // A duplicated string keeps its first id (ids are what the model was trained on; the
    // lookup only has to be deterministic).
    model.token_to_id_.emplace(tokens[id], static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    model.byte_to_id_[b] = model.Find(ByteLevelChar(static_cast<uint8_t>(b)));
  }
  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t left_id = model.Find(left);
    const int32_t right_id = model.Find(right);
    const int32_t merged_id = model.Find(left + right);
    if (left_id < 0 || right_id < 0 || merged_id < 0) {
      const char* missing = left_id < 0    ? "left token"
                            : right_id < 0 ? "right token"
                                           : "merged token";
      return absl::InvalidArgumentError(absl::StrCat("merge ", rank, " \"", left, " ", right,
                                                     "\": ", missing, " is not in the vocabulary"));
    }
    // A repeated pair takes the later rank, as tokenizers' map insertion does.
    model.merges_[PairKey(left_id, right_id)] = {static_cast<int32_t>(rank), merged_id};
  }
  return model;
}

int32_t BpeModel::Find(std::string_view byte_level_token) const {
  auto it = token_to_id_.find(byte_level_token);
  return it == token_to_id_.end() ? -1 : it->second;
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (piece.size() == 1 && byte_to_id_[static_cast<uint8_t>(piece[0])] >= 0) {
    ids->push_back(byte_to_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (options_.ignore_merges) {
    std::string byte_level;
    AppendByteLevel(piece, &byte_level);
    if (const int32_t id = Find(byte_level); id >= 0) {
      ids->push_back(id);
      return;
    }
  }

  // Symbols form a doubly linked list over the piece's bytes; a merge folds the right
  // symbol into the left one and marks it dead.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) {
    int32_t id = byte_to_id_[static_cast<uint8_t>(c)];
    if (id < 0) {
      if (options_.unk_id < 0) continue;
      id = options_.unk_id;
      if (options_.fuse_unk && !symbols.empty() && symbols.back().id == id) continue;
    }
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Candidate merges ordered by (rank, position of the left symbol), smallest first.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t left_pos) {
    const int32_t right_pos = symbols[left_pos].next;
    if (right_pos < 0) return;
    auto it = merges_.find(PairKey(symbols[left_pos].id, symbols[right_pos].id));
    if (it != merges_.end()) queue.push({it->second.rank, left_pos, it->second.id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale entry: one side changed since it was queued.
    auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.id != top.id) continue;
    Symbol& right = symbols[left.next];
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

}  // namespace ridgeserve

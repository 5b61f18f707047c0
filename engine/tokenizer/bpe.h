// Byte-level BPE: the merge loop over one pre-tokenized piece. Merges apply by rank
// (lowest first, leftmost on ties), exactly as Hugging Face tokenizers' BPE does, through a
// priority queue over a linked list of symbols: O(n log n) in the piece length, so long
// whitespace runs or minified code do not go quadratic.
#ifndef RIDGESERVE_ENGINE_TOKENIZER_BPE_H_
#define RIDGESERVE_ENGINE_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace ridgeserve {

struct BpeOptions {
  // Llama 3's tokenizer: a piece that is itself in the vocabulary is emitted whole, without
  // running merges (the merges would not always reach it).
  bool ignore_merges = false;
  // Emitted for a byte whose symbol is not in the vocabulary; -1 drops such bytes (as
  // tokenizers does without an unk token). Byte-level vocabularies hold all 256 symbols.
  int32_t unk_id = -1;
  bool fuse_unk = false;
};

class BpeModel {
 public:
  // `tokens[id]` is the token in byte-level form ("Ġhello"); empty strings are holes that no
  // text maps to. `merges` are (left, right) in byte-level form, in rank order. Every merge
  // operand and result must be a token. Errors name the offending merge.
  static absl::StatusOr<BpeModel> Create(
      const std::vector<std::string>& tokens,
      const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options);

  // Appends the ids of one piece of raw bytes to `ids`. Thread-safe.
  void Encode(std::string_view piece, std::vector<int32_t>* ids) const;

  // Id of a token given in byte-level form, -1 if absent.
  int32_t Find(std::string_view byte_level_token) const;

 private:
  struct MergeResult {
    int32_t rank;
    int32_t id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  // Transparent std::string_view hashing: this absl predates std::string_view interop.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct StringEq {
    using is_transparent = void;
    bool operator()(std::string_view a, std::string_view b) const { return a == b; }
  };

  BpeOptions options_;
  absl::flat_hash_map<std::string, int32_t, StringHash, StringEq> token_to_id_;
  std::array<int32_t, 256> byte_to_id_{};              // id of each byte's one-symbol token, or -1
  absl::flat_hash_map<uint64_t, MergeResult> merges_;  // key: PairKey(left id, right id)
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_BPE_H_

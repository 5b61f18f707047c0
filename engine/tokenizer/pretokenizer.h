// Pre-tokenization: splits text into the pieces BPE runs on, with the model's regexes
// (PCRE2, UTF + UCP, JIT when available). A pre-tokenizer is a sequence of steps, mirroring
// Hugging Face tokenizers' Sequence of Split / Digits / ByteLevel; each step re-splits every
// piece the previous step produced.
#ifndef RIDGESERVE_ENGINE_TOKENIZER_PRETOKENIZER_H_
#define RIDGESERVE_ENGINE_TOKENIZER_PRETOKENIZER_H_

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve {

// What a Split step does with the regex matches (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior {
  kRemoved,             // matches are dropped
  kIsolated,            // matches and the gaps between them are separate pieces
  kMergedWithPrevious,  // a match joins the piece before it
  kMergedWithNext,      // a match joins the piece after it
  kContiguous,          // runs of matches (and runs of gaps) form one piece each
};

absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name);

// GPT-2's pre-tokenizer regex (tokenizers' ByteLevel with use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // The pre-tokenizer llama.cpp associates with GGUF `tokenizer.ggml.pre` ("smollm",
  // "llama-bpe", "qwen2", "gpt2", "default", ...). Unknown names are an error rather than a
  // silent fallback: a wrong split changes every id.
  static absl::StatusOr<PreTokenizer> ForGgufPre(std::string_view pre);

  // Steps, applied in the order added.
  // Split on `pattern` (a regex, or a literal string when !is_regex); `invert` swaps which
  // spans count as matches.
  absl::Status AddSplit(std::string_view pattern, bool is_regex, SplitBehavior behavior,
                        bool invert);
  // tokenizers' Digits: every numeric character alone, or runs of them.
  absl::Status AddDigits(bool individual_digits);
  // tokenizers' ByteLevel: optionally prefix each piece with a space, then optionally split
  // with the GPT-2 regex. (The byte -> symbol mapping itself happens in BPE.)
  absl::Status AddByteLevel(bool add_prefix_space, bool use_regex);

  // Appends the pieces of `text` to `pieces`. Pieces point into `text` or, when a step
  // inserts a prefix space, into strings appended to `storage`. Thread-safe.
  void Split(std::string_view text, std::vector<std::string_view>* pieces,
             std::deque<std::string>* storage) const;

 private:
  struct Step;
  std::vector<Step> steps_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_PRETOKENIZER_H_

#include "engine/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace ridgeserve {

namespace {

// Unicode White_Space, which is what \s means to Oniguruma (tokenizers' regex engine) and to
// Rust's regex. PCRE2's \s under UCP also matches U+180E (MONGOLIAN VOWEL SEPARATOR, no
// longer a space since Unicode 6.3), which would split pieces differently.
constexpr std::string_view kWhiteSpaceClassBody =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F})"
    R"(\x{205F}\x{3000})";

// Rewrites \s and \S (outside character classes; \s also inside them) to explicit
// White_Space classes. \S inside a class is left alone: PCRE2 has no class subtraction.
std::string RewriteWhitespaceEscapes(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        if (!in_class) out += '[';
        out += kWhiteSpaceClassBody;
        if (!in_class) out += ']';
      } else if (next == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceClassBody;
        out += ']';
      } else if (next == 'Q') {
        // \Q...\E quotes everything up to \E (or the end) literally.
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop;
        continue;
      } else {
        out += c;
        out += next;
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      // "[^" and a ']' first in a class (a literal) do not close it.
      if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
      if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // A POSIX class such as [:alpha:] inside a class.
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

}  // namespace

namespace pretokenizer_internal {

// A compiled PCRE2 pattern. The code is immutable and shared by threads; match data is
// per call.
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern,
                                                              bool literal) {
    // MATCH_INVALID_UTF: user text may hold invalid UTF-8; invalid bytes then never match
    // and end up in gap pieces, so they still round-trip through byte-level BPE.
    uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    if (literal) options |= PCRE2_LITERAL;
    const std::string source = literal ? std::string(pattern) : RewriteWhitespaceEscapes(pattern);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                     options, &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer regex \"", std::string(pattern),
                                                     "\" at offset ", error_offset, ": ",
                                                     reinterpret_cast<const char*>(message)));
    }
    auto regex = std::shared_ptr<Regex>(new Regex(code));
    // JIT is an optimization: without it (unsupported CPU or build) the interpreter runs.
    regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return std::shared_ptr<const Regex>(std::move(regex));
  }

  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match of the pattern in `text`, as (start, end) byte offsets, in order. An empty
  // match advances the search by one character, as Oniguruma's find_iter (used by
  // tokenizers) does.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
    matches->clear();
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t offset = 0;
    while (offset <= text.size()) {
      int rc = pcre2_match(code_, subject, text.size(), offset, 0, data, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_) {
        // Pathological input for the JIT's fixed stack: the interpreter uses the heap.
        rc = pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_JIT, data, nullptr);
      }
      if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: rest becomes a gap
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
      const size_t start = ovector[0];
      const size_t end = ovector[1];
      matches->emplace_back(start, end);
      if (end > start) {
        offset = end;
      } else if (end < text.size()) {
        offset = end + Utf8CharLength(text.substr(end));
      } else {
        break;
      }
    }
    pcre2_match_data_free(data);
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
  bool jit_ = false;
};

}  // namespace pretokenizer_internal

using pretokenizer_internal::Regex;

struct PreTokenizer::Step {
  std::shared_ptr<const Regex> regex;  // null: no split
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // applied to each piece before splitting
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown split behavior \"", std::string(name), "\""));
}

absl::StatusOr<PreTokenizer> PreTokenizer::ForGgufPre(std::string_view pre) {
  PreTokenizer p;
  absl::Status status;
  if (pre == "default" || pre == "gpt2" || pre.empty()) {
    status = p.AddByteLevel(false, true);
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    status = p.AddDigits(true);
    if (status.ok()) status = p.AddByteLevel(false, true);
  } else if (pre == "llama-bpe" || pre == "llama3") {
    status = p.AddSplit(kLlama3Pattern, true, SplitBehavior::kIsolated, false);
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    status = p.AddSplit(kQwen2Pattern, true, SplitBehavior::kIsolated, false);
  } else {
    return absl::UnimplementedError(
        absl::StrCat("unsupported pre-tokenizer tokenizer.ggml.pre = \"", std::string(pre),
                     "\" (supported: default, gpt2, smollm, starcoder, refact, llama-bpe, "
                     "llama3, qwen2, deepseek-r1-qwen)"));
  }
  if (!status.ok()) return status;
  return p;
}

absl::Status PreTokenizer::AddSplit(std::string_view pattern, bool is_regex, SplitBehavior behavior,
                                    bool invert) {
  auto regex = Regex::Compile(pattern, !is_regex);
  if (!regex.ok()) return regex.status();
  steps_.push_back(Step{*std::move(regex), behavior, invert, false});
  return absl::OkStatus();
}

absl::Status PreTokenizer::AddDigits(bool individual_digits) {
  // tokenizers matches char::is_numeric, i.e. general categories Nd, Nl and No = \p{N}.
  return AddSplit(R"(\p{N})", true,
                  individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false);
}

absl::Status PreTokenizer::AddByteLevel(bool add_prefix_space, bool use_regex) {
  Step step;
  step.add_prefix_space = add_prefix_space;
  if (use_regex) {
    auto regex = Regex::Compile(kGpt2Pattern, false);
    if (!regex.ok()) return regex.status();
    step.regex = *std::move(regex);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

namespace {

// One span of a piece: [start, end) and whether it is a (possibly inverted) match.
struct Span {
  size_t start;
  size_t end;
  bool is_match;
};

// Applies `behavior` to spans covering a piece (tokenizers' NormalizedString::split) and
// appends the non-empty resulting pieces.
void EmitSplit(std::string_view piece, const std::vector<Span>& spans, SplitBehavior behavior,
               std::vector<std::string_view>* out) {
  std::vector<std::pair<size_t, size_t>> merged;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) merged.emplace_back(s.start, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) merged.emplace_back(s.start, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().second = s.end;
        } else {
          merged.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().first = it->start;
        } else {
          merged.emplace_back(it->start, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().second = s.end;
        } else {
          merged.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  for (const auto& [start, end] : merged) {
    if (end > start) out->push_back(piece.substr(start, end - start));
  }
}

}  // namespace

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* pieces,
                         std::deque<std::string>* storage) const {
  std::vector<std::string_view> current;
  if (!text.empty()) current.push_back(text);
  std::vector<std::string_view> next;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Span> spans;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : current) {
      if (step.add_prefix_space && piece[0] != ' ') {
        std::string& prefixed = storage->emplace_back();
        prefixed.reserve(piece.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(piece);
        piece = prefixed;
      }
      if (step.regex == nullptr) {
        next.push_back(piece);
        continue;
      }
      step.regex->FindAll(piece, &matches);
      spans.clear();
      size_t previous_end = 0;
      for (const auto& [start, end] : matches) {
        if (start > previous_end) spans.push_back({previous_end, start, step.invert});
        spans.push_back({start, end, !step.invert});
        previous_end = end;
      }
      if (previous_end < piece.size()) spans.push_back({previous_end, piece.size(), step.invert});
      EmitSplit(piece, spans, step.behavior, &next);
    }
    current.swap(next);
  }
  pieces->insert(pieces->end(), current.begin(), current.end());
}

}  // namespace ridgeserve

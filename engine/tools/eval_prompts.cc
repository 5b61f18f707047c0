#include "engine/tools/eval_prompts.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/ridgefill/ridgefill_plan.h"
#include "engine/tools/bench_util.h"

namespace ridgeserve {

std::vector<int32_t> BosPrefix(const Tokenizer& tok) {
  return tok.Encode("", /*add_bos=*/true, /*parse_special=*/false);
}

absl::StatusOr<std::vector<int32_t>> TtftPrompt(const ModelConfig& c, int32_t length,
                                                std::span<const int32_t> source) {
  if (length <= 0 || length > c.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lengths: ", length, " is outside 1..", c.context_length));
  }
  if (source.empty()) return RandomTokenIds(length, c.vocab_size, 1234);
  std::vector<int32_t> tokens(length);
  for (int32_t i = 0; i < length; ++i) tokens[i] = source[i % source.size()];
  return tokens;
}

NeedlePrompts::NeedlePrompts(const Model& model, std::vector<int32_t> hay)
    : model_(&model),
      hay_(std::move(hay)),
      bos_(BosPrefix(*model.tokenizer)),
      // Plain completion (no chat template): the question ends in the needle's own wording so
      // that the answer is the next tokens.
      question_(model.tokenizer->Encode(
          "\n\nWhat is the secret passphrase? The secret passphrase is", false, false)) {}

absl::StatusOr<NeedlePrompts> NeedlePrompts::Create(const Model& model,
                                                    const std::string& haystack) {
  std::vector<int32_t> hay = model.tokenizer->Encode(haystack, false, false);
  if (hay.empty()) return absl::InvalidArgumentError("--haystack has no tokens");
  return NeedlePrompts(model, std::move(hay));
}

absl::StatusOr<NeedlePrompt> NeedlePrompts::Make(const NeedleSetup& o, int32_t length, double depth,
                                                 int32_t trial) const {
  // The server's default: rows at positions < 4 stay exact (attention sinks).
  constexpr int32_t kSinkTokens = RidgeFillPlanOptions{}.sink_tokens;
  if (depth < 0 || depth > 1) {
    return absl::InvalidArgumentError(absl::StrCat("--depths: ", depth, " is outside [0, 1]"));
  }
  std::mt19937_64 rng(o.seed * 1000003 + length * 101 + static_cast<int>(depth * 1000) +
                      trial * 7919);
  NeedlePrompt out;
  out.number = std::to_string(std::uniform_int_distribution<int32_t>(10000, 99999)(rng));
  const std::vector<int32_t> needle = model_->tokenizer->Encode(
      absl::StrCat("\nThe secret passphrase is ", out.number, ".\n"), false, false);
  const int32_t n = static_cast<int32_t>(needle.size());
  const int32_t head = static_cast<int32_t>(bos_.size());
  const int32_t q = static_cast<int32_t>(question_.size());
  if (length > model_->config.context_length || length < head + n + q + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lengths: ", length, " cannot hold BOS, needle and question"));
  }
  const int32_t filled = std::max(0, length - o.exact_tail_tokens);
  // Needle start position: inside [sink, filled) when it fits, else anywhere before the
  // question.
  int32_t lo = std::max(kSinkTokens, head), hi = filled - n;
  if (hi < lo) {
    out.in_filled_region = false;
    lo = head;
    hi = length - q - n;
  }
  out.needle_position = lo + static_cast<int32_t>(std::lround(depth * (hi - lo)));
  size_t h = std::uniform_int_distribution<size_t>(0, hay_.size() - 1)(rng);
  std::vector<int32_t>& prompt = out.tokens;
  prompt = bos_;
  while (static_cast<int32_t>(prompt.size()) < out.needle_position) {
    prompt.push_back(hay_[h++ % hay_.size()]);
  }
  prompt.insert(prompt.end(), needle.begin(), needle.end());
  while (static_cast<int32_t>(prompt.size()) < length - q)
    prompt.push_back(hay_[h++ % hay_.size()]);
  prompt.insert(prompt.end(), question_.begin(), question_.end());
  return out;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> MakeWindows(const Model& model,
                                                              const DistantLossSetup& o) {
  const int32_t p = o.prompt_tokens;
  if (p < 3 || p > model.config.context_length || o.exact_tail_tokens < 2 || o.windows < 1 ||
      o.chunk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 3 <= --prompt_tokens <= ", model.config.context_length,
                     ", --exact_tail_tokens >= 2, --windows >= 1, --chunk >= 1"));
  }
  const Tokenizer& tok = *model.tokenizer;
  const std::vector<int32_t> bos = BosPrefix(tok);
  const std::vector<int32_t> text = tok.Encode(o.text, false, false);
  const int32_t body = p - static_cast<int32_t>(bos.size());
  if (static_cast<int64_t>(text.size()) < static_cast<int64_t>(body) * o.windows) {
    return absl::InvalidArgumentError(absl::StrCat("--text has ", text.size(), " tokens; ",
                                                   o.windows, " windows of ", p, " need ",
                                                   static_cast<int64_t>(body) * o.windows));
  }
  std::vector<std::vector<int32_t>> windows;
  for (int32_t w = 0; w < o.windows; ++w) {
    std::vector<int32_t> window = bos;
    window.insert(window.end(), text.begin() + static_cast<int64_t>(w) * body,
                  text.begin() + static_cast<int64_t>(w + 1) * body);
    windows.push_back(std::move(window));
  }
  return windows;
}

}  // namespace ridgeserve

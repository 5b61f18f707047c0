// The prompts of ridgeserve-eval's ttft, needle and distant-loss evaluations, built in one place
// so that every prefill method (exact, RidgeFill, SpecPC) is measured on the same tokens: the
// *Setup structs hold what defines an evaluation apart from the method, and the functions here
// turn them into token sequences.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_PROMPTS_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_PROMPTS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"

namespace ridgeserve {

struct TtftSetup {
  std::vector<int32_t> prompt_tokens;  // tokens of prompt_source, repeated when short
  std::vector<int32_t> prompt_source;  // empty = fixed pseudo-random tokens
  int32_t repetitions = 2;
  int32_t chunk = 512;
};

struct NeedleSetup {
  std::string haystack_text;     // filler text (repeated when short)
  std::vector<int32_t> lengths;  // prompt lengths in tokens (BOS and question included)
  std::vector<double> depths;    // needle position as a fraction of the filled region, [0, 1]
  int32_t trials = 5;            // per (length, depth): different numbers and haystack offsets
  // The needle sits in [sink, length - exact_tail_tokens) (RidgeFill's filled region) when it
  // fits there, else anywhere before the question.
  int32_t exact_tail_tokens = 1024;
  int32_t new_tokens = 8;  // greedy tokens decoded after the question
  int32_t chunk = 512;
  uint64_t seed = 1;
};

struct DistantLossSetup {
  std::string text;
  int32_t prompt_tokens = 4096;      // per window: context prefix + scored tail
  int32_t exact_tail_tokens = 1024;  // the tail
  int32_t windows = 1;               // consecutive non-overlapping windows of the text
  // A tail token is "distant-dependent" when its NLL with the full (exact) context is lower
  // than with the tail alone as context by more than this many nats.
  double distant_threshold_nats = 1.0;
  int32_t chunk = 512;
};

// The model's BOS prefix ([] when it wants none).
std::vector<int32_t> BosPrefix(const Tokenizer& tok);

// ttft's prompt of `length` tokens: `source` repeated, or fixed pseudo-random tokens when it is
// empty (content does not change the cost). InvalidArgument outside 1..context_length.
absl::StatusOr<std::vector<int32_t>> TtftPrompt(const ModelConfig& config, int32_t length,
                                                std::span<const int32_t> source);

// One needle trial's prompt: [BOS] haystack, "The secret passphrase is NNNNN." at
// needle_position, more haystack, then the question, whose answer is the next tokens.
struct NeedlePrompt {
  std::vector<int32_t> tokens;
  std::string number;  // the passphrase an answer must contain
  int32_t needle_position = 0;
  bool in_filled_region = true;  // placed in [sink, length - exact_tail_tokens)
};

class NeedlePrompts {
 public:
  // InvalidArgument when the haystack has no tokens.
  static absl::StatusOr<NeedlePrompts> Create(const Model& model, const std::string& haystack);

  // The prompt of `trial` at (length, depth): a different number and haystack offset per
  // trial, reproducible per (seed, length, depth, trial). InvalidArgument when the depth is
  // outside [0, 1] or the length cannot hold BOS, needle and question.
  absl::StatusOr<NeedlePrompt> Make(const NeedleSetup& setup, int32_t length, double depth,
                                    int32_t trial) const;

 private:
  NeedlePrompts(const Model& model, std::vector<int32_t> hay);

  const Model* model_;
  std::vector<int32_t> hay_, bos_, question_;
};

// distant-loss's windows of the text: [BOS] text[w * body ..], prompt_tokens long each.
absl::StatusOr<std::vector<std::vector<int32_t>>> MakeWindows(const Model& model,
                                                              const DistantLossSetup& setup);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_PROMPTS_H_

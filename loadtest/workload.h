// The requests a run sends: prompts cut from a real text file at seeded random offsets (token
// ids from the server's own Tokenize RPC, so prompt lengths are exact), output lengths from a
// distribution, and a prefill mode per request from a seeded mix that is balanced in short
// blocks (ridgefill 0.5: every pair of consecutive requests has one of each, in random order;
// exact 0.5, ridgefill 0.25, spec_pc 0.25: every 4 requests have 2, 1 and 1; spec_kv likewise).
#ifndef RIDGESERVE_LOADTEST_WORKLOAD_H_
#define RIDGESERVE_LOADTEST_WORKLOAD_H_

#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loadtest/length_distribution.h"
#include "loadtest/request_record.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"

namespace ridgeserve::loadtest {

// A text file as the server tokenizes it (no special tokens added).
struct TokenCorpus {
  std::vector<int32_t> ids;
  // Chat prompts only: each token's text (lossy UTF-8 as the server returns it), concatenated,
  // with token i at [text_offsets[i], text_offsets[i + 1]).
  std::string text;
  std::vector<size_t> text_offsets;
};

// Reads at most `max_bytes` of `path` and tokenizes it with the server's Tokenize RPC in
// pieces split at whitespace (each call bounded by `timeout_s`). `keep_text` fills the text
// fields.
absl::StatusOr<TokenCorpus> LoadTokenCorpus(v1::Inference::Stub& stub, const std::string& path,
                                            size_t max_bytes, bool keep_text, double timeout_s);

// The fraction of requests sent in each prefill mode, by PrefillKind; they sum to 1.
using ModeShares = std::array<double, kNumPrefillKinds>;

// "exact=0.4,ridgefill=0.2,spec_pc=0.2,spec_kv=0.2" (modes left out get 0): InvalidArgument naming
// --mode_share for an unknown or repeated mode, a share outside [0, 1] or shares not summing to 1.
absl::StatusOr<ModeShares> ParseModeShare(absl::string_view text);

struct WorkloadOptions {
  LengthDistribution prompt_tokens;
  LengthDistribution output_tokens;
  // Send the slice's text as one user message through the server's chat template: the prompt
  // the model sees is then longer by the template (and the re-tokenized text can differ by a
  // few tokens), so lengths are approximate.
  bool chat = false;
  ModeShares mode_share = {1, 0, 0, 0};  // all exact
  // RIDGEFILL requests (unset: the server's defaults).
  std::optional<int32_t> exact_tail_tokens = std::nullopt;
  std::optional<int32_t> split_layer = std::nullopt;
  std::optional<int32_t> spec_pc_budget = std::nullopt;  // SPEC_PC requests
  std::optional<int32_t> spec_kv_budget = std::nullopt;  // SPEC_KV requests
  float temperature = 0;
  bool ignore_eos = true;  // so every request decodes exactly its output length
  uint64_t seed = 0;
  std::string request_id_prefix = "";
};

struct PlannedRequest {
  v1::GenerateRequest request;
  PrefillKind mode = PrefillKind::kExact;
  int32_t prompt_tokens = 0;
  int32_t max_new_tokens = 0;
};

// Not thread-safe: the runner's one issuing thread calls Next().
class RequestFactory {
 public:
  // InvalidArgument when the corpus is shorter than the longest prompt asked for.
  static absl::StatusOr<RequestFactory> Create(WorkloadOptions options, TokenCorpus corpus);

  PlannedRequest Next();
  // Starts a fresh block of the prefill mix, so each phase is balanced from its first request
  // whatever an earlier phase (or the warm-up) left over.
  void RestartModeMix() { mode_block_.clear(); }

 private:
  RequestFactory(WorkloadOptions options, TokenCorpus corpus);
  PrefillKind NextMode();

  WorkloadOptions options_;
  TokenCorpus corpus_;
  std::mt19937_64 length_rng_;
  std::mt19937_64 offset_rng_;
  std::mt19937_64 mode_rng_;
  std::vector<PrefillKind> mode_block_;  // modes left in the current shuffled block
  int64_t issued_ = 0;
};

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_WORKLOAD_H_

// What the load generator measured for one request, as plain data (no gRPC types), so the
// statistics and reports are testable without a server. Times are seconds on the client's
// steady clock: `*_at_s` since the start of the run, the rest durations.
#ifndef RIDGESERVE_LOADTEST_REQUEST_RECORD_H_
#define RIDGESERVE_LOADTEST_REQUEST_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ridgeserve::loadtest {

// The prefill modes a run mixes (PrefillOptions.mode EXACT, RIDGEFILL, SPEC_PC or SPEC_KV).
enum class PrefillKind { kExact, kRidgeFill, kSpecPc, kSpecKv };
inline constexpr int kNumPrefillKinds = 4;
inline constexpr PrefillKind kPrefillKinds[kNumPrefillKinds] = {
    PrefillKind::kExact, PrefillKind::kRidgeFill, PrefillKind::kSpecPc, PrefillKind::kSpecKv};

// "exact", "ridgefill", "spec_pc" or "spec_kv": the key used in the flags, JSON, CSV and
// tables.
const char* PrefillKindName(PrefillKind kind);

struct RequestRecord {
  int64_t index = 0;  // order of issue in the run (warm-up requests excluded)
  int32_t phase = 0;  // index of the arrival phase (one per rate of a sweep)
  std::string request_id;
  PrefillKind mode = PrefillKind::kExact;
  int32_t prompt_tokens = 0;   // as sent (token_ids) or as planned (chat: approximate)
  int32_t max_new_tokens = 0;  // as asked

  double scheduled_at_s = 0;  // when the arrival process wanted it sent
  double sent_at_s = 0;       // when the call started (TTFT and E2E count from here)

  // Client-side, queue-inclusive: from the call's start to the first message with tokens.
  // Negative when no token arrived.
  double ttft_s = -1;
  // Gaps between consecutive messages that carry tokens (one per message: a message can hold
  // more than one token when the server holds back a split UTF-8 character or stop string).
  std::vector<double> itl_s;
  // (last token - first token) / (output_tokens - 1); negative with fewer than 2 tokens.
  double tpot_s = -1;
  double e2e_s = 0;           // call start to the stream's final status
  int32_t output_tokens = 0;  // token ids received

  // From the final message (zero when the call failed before it).
  int32_t server_prompt_tokens = 0;
  int32_t server_filled_prompt_tokens = 0;
  int32_t server_kept_prompt_tokens = 0;  // SpecPC: prompt tokens the model prefilled
  int32_t server_kept_kv_tokens = 0;      // SpecKV: KV entries kept per layer and KV head
  double server_ttft_s = 0;
  double server_queue_s = 0;
  std::string finish_reason;  // STOP, LENGTH, ... ; empty when none arrived

  int32_t status_code = 0;  // gRPC status code (0 = OK)
  std::string status_name;  // "OK", "RESOURCE_EXHAUSTED", ...
  std::string status_message;

  bool ok() const { return status_code == 0; }
};

// One arrival phase: a closed loop at a concurrency, or an open loop at one rate.
struct PhaseSpec {
  std::string arrival;       // "closed", "poisson" or "gamma"
  double rate = 0;           // open loop: mean requests per second
  double burstiness = 1;     // gamma shape (1 for poisson)
  int32_t concurrency = 1;   // closed loop
  int64_t num_requests = 0;  // at most this many sent
  double duration_s = 0;     // and none sent after this long
};

struct PhaseResult {
  PhaseSpec spec;
  double started_at_s = 0;             // first send, since the start of the run
  double duration_s = 0;               // first send to last completion
  std::vector<RequestRecord> records;  // in order of completion
};

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_REQUEST_RECORD_H_

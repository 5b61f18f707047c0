// Server options that shape how requests are served (from ridgeserve's flags), kept apart from
// the model's architecture (ModelConfig) and from per-request options (the proto).
#ifndef RIDGESERVE_SERVER_SERVER_OPTIONS_H_
#define RIDGESERVE_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ridgeserve {

// Defaults of --max_stop_strings and --max_stop_string_bytes.
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 256;

struct ServerOptions {
  std::string backend = "cpu";  // reported by GetModelInfo
  int32_t tensor_parallel = 1;
  // Threads that turn engine events into responses (--event_threads; at least 1).
  int32_t event_threads = 1;
  // RidgeFill: tokens at the end of the prompt that run exactly when a request does not say.
  int32_t default_exact_tail_tokens = 1024;
  // Limits of one request (--max_prompt_tokens, --max_stop_strings, --max_stop_string_bytes);
  // a request over one is refused with a status naming the flag.
  int32_t max_prompt_tokens = 0;  // 0: the model's context is the only limit
  int32_t max_stop_strings = kMaxStopStrings;
  int32_t max_stop_string_bytes = kMaxStopStringBytes;
  // RidgeFill, as of the request (the maps may be swapped while serving: GenerateCall fills
  // these from a RidgeFillMapsManager snapshot). Split layers of the loaded maps; empty: none
  // loaded, RIDGEFILL is refused with FAILED_PRECONDITION saying ridgefill_unavailable.
  std::vector<int32_t> ridgefill_split_layers;
  // The split a RIDGEFILL request gets when it names none (one of ridgefill_split_layers).
  int32_t default_split_layer = -1;
  std::string ridgefill_unavailable;  // why no maps are loaded (e.g. calibration progress)
  // A draft model is loaded (--draft_model): SPEC_PC and SPEC_KV possible; without one they are
  // refused with FAILED_PRECONDITION.
  bool has_draft_model = false;
  // SpecPC: what a SPEC_PC request gets when it leaves budget / lookahead_tokens unset
  // (--spec_pc_budget, --spec_pc_lookahead_tokens).
  int32_t spec_pc_budget = 2048;
  int32_t spec_pc_lookahead_tokens = 1;
  // SpecKV: the same for SPEC_KV (--spec_kv_budget, --spec_kv_lookahead_tokens).
  int32_t spec_kv_budget = 1024;
  int32_t spec_kv_lookahead_tokens = 64;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_SERVER_OPTIONS_H_

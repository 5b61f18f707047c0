// Builds a request's responses from the engine's TokenEvents: detokenizes incrementally
// (StreamDecoder, so a delta never splits a UTF-8 character), applies stop strings
// (StopMatcher, across token boundaries), and fills finish_reason, usage and timing on the
// final message. Transport-agnostic: the streaming reactor writes each delta, the unary one
// merges them.
//
// Threading: one instance per request; OnEvent is called in event order (on the call's lane).
#ifndef RIDGESERVE_SERVER_OUTPUT_BUILDER_H_
#define RIDGESERVE_SERVER_OUTPUT_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "ridgeserve/v1/ridgeserve.pb.h"
#include "server/stop_matcher.h"

namespace ridgeserve {

class OutputBuilder {
 public:
  struct Step {
    // The text and tokens this event adds (text may lag tokens while it could be the start of
    // a stop string). On the final step also finish_reason, usage and timing.
    v1::GenerateResponse delta;
    // A stop string matched and the engine is still generating: abort the engine request
    // (its later tokens are dropped here).
    bool abort_engine = false;
    bool finished = false;
    absl::Status status;  // final and not OK: the request failed; end the call with it
  };

  // `tokenizer` must outlive the builder.
  OutputBuilder(const Tokenizer& tokenizer, std::string request_id, std::vector<std::string> stop,
                int32_t prompt_tokens);

  Step OnEvent(const TokenEvent& event);

  int32_t completion_tokens() const { return completion_tokens_; }
  bool stop_matched() const { return stops_.matched(); }

 private:
  std::string request_id_;
  StreamDecoder decoder_;
  StopMatcher stops_;
  int32_t prompt_tokens_;
  int32_t completion_tokens_ = 0;  // tokens handed to the client (none after a stop match)
};

// Appends a delta to the whole response a unary Generate returns.
void MergeDelta(const v1::GenerateResponse& delta, v1::GenerateResponse& total);

v1::FinishReason ToProto(FinishReason reason);

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_OUTPUT_BUILDER_H_

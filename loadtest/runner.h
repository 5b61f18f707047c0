// Drives the calls of a run, one phase at a time, from one issuing thread: a closed loop keeps
// `concurrency` calls in flight; an open loop sends at the arrival process's times whatever is
// in flight (queue-inclusive latency). A phase stops sending at its request limit or after
// its duration, then waits for its calls (each bounded by the request timeout) before the
// next phase starts, so phases never overlap.
#ifndef RIDGESERVE_LOADTEST_RUNNER_H_
#define RIDGESERVE_LOADTEST_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loadtest/progress_line.h"
#include "loadtest/request_record.h"
#include "loadtest/stream_call.h"
#include "loadtest/workload.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"

namespace ridgeserve::loadtest {

class Runner {
 public:
  Runner(v1::Inference::Stub& stub, RequestFactory& factory, double timeout_s, uint64_t seed,
         ProgressLine& progress);

  // Runs one phase to its end; `index` numbers the phase in the records and seeds its
  // arrivals, `label` names it on the progress line.
  PhaseResult RunPhase(int32_t index, const std::string& label, const PhaseSpec& spec);

 private:
  void Issue(int32_t phase, double scheduled_at_s, const std::shared_ptr<CallSink>& sink);
  double SinceEpoch(Clock::time_point t) const;

  v1::Inference::Stub& stub_;
  RequestFactory& factory_;
  double timeout_s_;
  uint64_t seed_;
  ProgressLine& progress_;
  Clock::time_point epoch_;
  int64_t next_index_ = 0;
};

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_RUNNER_H_

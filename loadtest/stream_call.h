// One GenerateStream call on gRPC's callback API: the reactor owns the call's state, times
// every message on the client's clock, and deletes itself in OnDone after handing its
// RequestRecord to the shared CallSink. Reactions never block (one short mutex hold in OnDone).
#ifndef RIDGESERVE_LOADTEST_STREAM_CALL_H_
#define RIDGESERVE_LOADTEST_STREAM_CALL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "loadtest/request_record.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"

namespace ridgeserve::loadtest {

using Clock = std::chrono::steady_clock;

// Where finished calls land. Shared by the runner and every live call (a call may outlive a
// runner that gave up waiting for it). Thread-safe.
class CallSink {
 public:
  void Started();
  void Finished(RequestRecord record);

  // Moves out the records finished so far.
  std::vector<RequestRecord> Take();
  int64_t in_flight() const;
  // Waits until fewer than `limit` calls are in flight, or `deadline`; true in the first case.
  bool WaitInFlightBelow(int64_t limit, Clock::time_point deadline);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t in_flight_ = 0;
  std::vector<RequestRecord> done_;
};

class StreamCall final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  // Starts the call; `record` carries what is known before sending (index, phase, mode,
  // lengths, scheduled time). `epoch` is the run's time zero.
  static void Start(v1::Inference::Stub& stub, v1::GenerateRequest request, RequestRecord record,
                    double timeout_s, Clock::time_point epoch, std::shared_ptr<CallSink> sink);

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  StreamCall(v1::GenerateRequest request, RequestRecord record, Clock::time_point epoch,
             std::shared_ptr<CallSink> sink);
  double Now() const;

  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  RequestRecord record_;
  Clock::time_point epoch_;
  std::shared_ptr<CallSink> sink_;
  double first_token_at_s_ = -1;
  double last_token_at_s_ = -1;
};

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_STREAM_CALL_H_

#include "loadtest/stream_call.h"

#include <utility>

#include "absl/status/status.h"

namespace ridgeserve::loadtest {

void CallSink::Started() {
  std::lock_guard<std::mutex> lock(mu_);
  ++in_flight_;
}

void CallSink::Finished(RequestRecord record) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    done_.push_back(std::move(record));
  }
  cv_.notify_all();
}

std::vector<RequestRecord> CallSink::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(done_, {});
}

int64_t CallSink::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

bool CallSink::WaitInFlightBelow(int64_t limit, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return in_flight_ < limit; });
}

void StreamCall::Start(v1::Inference::Stub& stub, v1::GenerateRequest request, RequestRecord record,
                       double timeout_s, Clock::time_point epoch, std::shared_ptr<CallSink> sink) {
  sink->Started();
  auto* call = new StreamCall(std::move(request), std::move(record), epoch, std::move(sink));
  call->context_.set_deadline(std::chrono::system_clock::now() +
                              std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
  call->record_.sent_at_s = call->Now();
  stub.async()->GenerateStream(&call->context_, &call->request_, call);
  call->StartRead(&call->response_);
  call->StartCall();
}

StreamCall::StreamCall(v1::GenerateRequest request, RequestRecord record, Clock::time_point epoch,
                       std::shared_ptr<CallSink> sink)
    : request_(std::move(request)),
      record_(std::move(record)),
      epoch_(epoch),
      sink_(std::move(sink)) {}

double StreamCall::Now() const {
  return std::chrono::duration<double>(Clock::now() - epoch_).count();
}

void StreamCall::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone follows with the status
  const double now = Now();
  if (response_.token_ids_size() > 0) {
    if (first_token_at_s_ < 0) {
      first_token_at_s_ = now;
      record_.ttft_s = now - record_.sent_at_s;
    } else {
      record_.itl_s.push_back(now - last_token_at_s_);
    }
    last_token_at_s_ = now;
    record_.output_tokens += response_.token_ids_size();
  }
  if (record_.request_id.empty()) record_.request_id = response_.request_id();
  if (response_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    record_.finish_reason = v1::FinishReason_Name(response_.finish_reason());
    record_.server_prompt_tokens = response_.usage().prompt_tokens();
    record_.server_filled_prompt_tokens = response_.usage().filled_prompt_tokens();
    record_.server_kept_prompt_tokens = response_.usage().kept_prompt_tokens();
    record_.server_kept_kv_tokens = response_.usage().kept_kv_tokens();
    record_.server_ttft_s = response_.timing().ttft_seconds();
    record_.server_queue_s = response_.timing().queue_seconds();
  }
  StartRead(&response_);
}

void StreamCall::OnDone(const grpc::Status& status) {
  record_.e2e_s = Now() - record_.sent_at_s;
  if (record_.output_tokens > 1) {
    record_.tpot_s = (last_token_at_s_ - first_token_at_s_) / (record_.output_tokens - 1);
  }
  record_.status_code = static_cast<int32_t>(status.error_code());
  // gRPC and absl share the canonical codes and their names.
  record_.status_name =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  record_.status_message = status.error_message();
  std::shared_ptr<CallSink> sink = std::move(sink_);
  sink->Finished(std::move(record_));
  delete this;
}

}  // namespace ridgeserve::loadtest

#include "loadtest/runner.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <thread>

#include "loadtest/arrival_process.h"

namespace ridgeserve::loadtest {
namespace {

// How often the issuing thread wakes to collect finished calls and refresh the progress line.
constexpr auto kTick = std::chrono::milliseconds(100);
// Beyond the request timeout, how long a phase waits for its last calls to report.
constexpr double kDrainSlackS = 5.0;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

Runner::Runner(v1::Inference::Stub& stub, RequestFactory& factory, double timeout_s, uint64_t seed,
               ProgressLine& progress)
    : stub_(stub),
      factory_(factory),
      timeout_s_(timeout_s),
      seed_(seed),
      progress_(progress),
      epoch_(Clock::now()) {}

double Runner::SinceEpoch(Clock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

void Runner::Issue(int32_t phase, double scheduled_at_s, const std::shared_ptr<CallSink>& sink) {
  PlannedRequest planned = factory_.Next();
  RequestRecord record;
  record.index = next_index_++;
  record.phase = phase;
  record.request_id = planned.request.request_id();
  record.mode = planned.mode;
  record.prompt_tokens = planned.prompt_tokens;
  record.max_new_tokens = planned.max_new_tokens;
  record.scheduled_at_s = scheduled_at_s;
  StreamCall::Start(stub_, std::move(planned.request), std::move(record), timeout_s_, epoch_, sink);
}

PhaseResult Runner::RunPhase(int32_t index, const std::string& label, const PhaseSpec& spec) {
  PhaseResult result;
  result.spec = spec;
  const bool closed = spec.arrival == "closed";
  std::optional<ArrivalProcess> arrivals;
  if (!closed) {
    arrivals.emplace(spec.rate, spec.arrival == "gamma" ? spec.burstiness : 1.0,
                     seed_ + 1000003ULL * static_cast<uint64_t>(index + 1));
  }

  factory_.RestartModeMix();
  auto sink = std::make_shared<CallSink>();
  ProgressState state;
  state.phase = label;
  state.limit = spec.num_requests;
  const Clock::time_point start = Clock::now();
  const auto collect = [&](bool force) {
    for (RequestRecord& r : sink->Take()) {
      ++state.done;
      if (!r.ok()) ++state.errors;
      result.records.push_back(std::move(r));
    }
    state.in_flight = sink->in_flight();
    state.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    progress_.Update(state, force);
  };

  // Sending: each pass sends one request or sleeps at most one tick, and ends by count or time.
  const Clock::time_point stop_sending = start + Seconds(spec.duration_s);
  Clock::time_point next_arrival = start;
  while (state.issued < spec.num_requests) {
    const Clock::time_point now = Clock::now();
    if (now >= stop_sending) break;
    if (closed) {
      if (sink->in_flight() < spec.concurrency) {
        Issue(index, SinceEpoch(now), sink);
        ++state.issued;
        continue;
      }
      sink->WaitInFlightBelow(spec.concurrency, std::min(stop_sending, now + kTick));
    } else {
      if (now >= next_arrival) {
        Issue(index, SinceEpoch(next_arrival), sink);
        ++state.issued;
        next_arrival += Seconds(arrivals->NextInterval());
        continue;
      }
      std::this_thread::sleep_until(std::min({next_arrival, stop_sending, now + kTick}));
    }
    collect(false);
  }

  // Draining: every call has a deadline, so this ends; the bound guards against a lost OnDone.
  const Clock::time_point drain_end = Clock::now() + Seconds(timeout_s_ + kDrainSlackS);
  while (sink->in_flight() > 0 && Clock::now() < drain_end) {
    sink->WaitInFlightBelow(1, std::min(drain_end, Clock::now() + kTick));
    collect(false);
  }
  collect(true);
  progress_.Finish();
  if (state.in_flight > 0) {
    std::fprintf(stderr, "[%s] %lld calls still in flight %.0f s after their deadline; left out\n",
                 label.c_str(), static_cast<long long>(state.in_flight), kDrainSlackS);
  }

  if (!result.records.empty()) {
    double first = result.records.front().sent_at_s;
    double last = first;
    for (const RequestRecord& r : result.records) {
      first = std::min(first, r.sent_at_s);
      last = std::max(last, r.sent_at_s + r.e2e_s);
    }
    result.started_at_s = first;
    result.duration_s = last - first;
  }
  return result;
}

}  // namespace ridgeserve::loadtest

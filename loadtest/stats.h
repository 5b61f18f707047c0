// Summaries of measured requests: latency percentiles (numpy's default linear interpolation,
// as vLLM's benchmark reports them), throughput, goodput under SLOs and errors by code.
#ifndef RIDGESERVE_LOADTEST_STATS_H_
#define RIDGESERVE_LOADTEST_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loadtest/request_record.h"

namespace ridgeserve::loadtest {

// Seconds.
struct LatencyStats {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0;
};

// q in [0, 100] of ascending `sorted` (non-empty), linearly interpolated between ranks.
double Percentile(const std::vector<double>& sorted, double q);
// All zeros for no values.
LatencyStats Describe(std::vector<double> values);

// A request is "good" when it succeeded and meets every SLO that is set (0: no limit).
struct Slo {
  double ttft_s = 0;
  double tpot_s = 0;  // a request with one output token has no TPOT and meets it
};

struct GroupSummary {
  int64_t num_requests = 0;  // issued (measured, warm-up excluded)
  int64_t num_ok = 0;
  int64_t num_errors = 0;
  std::map<std::string, int64_t> errors_by_code;  // "RESOURCE_EXHAUSTED" -> count
  // Over successful requests only.
  LatencyStats ttft, tpot, itl, e2e;
  int64_t prompt_tokens = 0;  // as the server counted them
  int64_t output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;  // successful requests per second of `duration_s`
  double output_token_throughput = 0;
  double total_token_throughput = 0;  // prompt + output tokens per second
  int64_t num_good = 0;
  double goodput = 0;  // good requests per second
};

GroupSummary Summarize(const std::vector<const RequestRecord*>& records, double duration_s,
                       const Slo& slo);

// "all" and one entry per prefill mode present in `records`.
std::map<std::string, GroupSummary> SummarizeByMode(
    const std::vector<const RequestRecord*>& records, double duration_s, const Slo& slo);

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_STATS_H_

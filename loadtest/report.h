// What a run reports: a summary table (stdout), JSON (summary per prefill mode, per phase and
// for the whole run, plus every request's record) and CSV (one row per request).
#ifndef RIDGESERVE_LOADTEST_REPORT_H_
#define RIDGESERVE_LOADTEST_REPORT_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loadtest/request_record.h"
#include "loadtest/stats.h"
#include "nlohmann/json.hpp"

namespace ridgeserve::loadtest {

struct RunReport {
  nlohmann::json config;        // the flags as used
  nlohmann::json model;         // from GetModelInfo
  int64_t warmup_requests = 0;  // sent before the phases, not in any statistic
  int64_t warmup_errors = 0;
  Slo slo;
  std::vector<PhaseResult> phases;
};

// The summary of every phase together (duration: the phases' durations added).
std::map<std::string, GroupSummary> SummarizeRun(const RunReport& report);

nlohmann::json ToJson(const GroupSummary& summary);
nlohmann::json ToJson(const RequestRecord& record);
// {"config", "model", "warmup", "num_requests_sent", "summary", "phases", "requests"}.
nlohmann::json ToJson(const RunReport& report);

void PrintTable(const RunReport& report, std::FILE* out);
absl::Status WriteJson(const RunReport& report, const std::string& path);
absl::Status WriteCsv(const RunReport& report, const std::string& path);

// "poisson 2.00 req/s", "gamma 2.00 req/s B=0.50", "closed c=4".
std::string PhaseLabel(const PhaseSpec& phase);

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_REPORT_H_

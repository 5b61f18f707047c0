// The optional PNG: TTFT CDF per prefill mode (exact vs RidgeFill) and, for a sweep of rates,
// TTFT p50/p95 and E2E p50 per mode against the offered rate. Drawn by gnuplot when installed.
#ifndef RIDGESERVE_LOADTEST_PLOT_H_
#define RIDGESERVE_LOADTEST_PLOT_H_

#include <string>

#include "absl/status/status.h"
#include "loadtest/report.h"

namespace ridgeserve::loadtest {

// FailedPrecondition when gnuplot is not on PATH (the caller says so; the run still counts).
absl::Status DrawPlot(const RunReport& report, const std::string& png_path);

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_PLOT_H_

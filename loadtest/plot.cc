#include "loadtest/plot.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"
#include "engine/tools/gnuplot.h"

namespace ridgeserve::loadtest {

absl::Status DrawPlot(const RunReport& report, const std::string& png_path) {
  RS_RETURN_IF_ERROR(CheckGnuplot());
  RS_ASSIGN_OR_RETURN(const std::filesystem::path dir, MakePlotDir("rs-loadtest-plot"));
  const bool sweep = report.phases.size() > 1;

  // TTFT CDF per mode, over every phase's successful requests.
  std::vector<std::string> cdf_plots;
  for (PrefillKind kind : kPrefillKinds) {
    std::vector<double> ttft_ms;
    for (const PhaseResult& p : report.phases) {
      for (const RequestRecord& r : p.records) {
        if (r.ok() && r.mode == kind && r.ttft_s >= 0) ttft_ms.push_back(r.ttft_s * 1e3);
      }
    }
    if (ttft_ms.empty()) continue;
    std::sort(ttft_ms.begin(), ttft_ms.end());
    const std::string file = (dir / absl::StrCat("ttft_", PrefillKindName(kind), ".dat")).string();
    std::ofstream f(file);
    f << ttft_ms[0] << " 0\n";  // the curve starts at 0 at the fastest request
    for (size_t i = 0; i < ttft_ms.size(); ++i) {
      f << ttft_ms[i] << " " << static_cast<double>(i + 1) / static_cast<double>(ttft_ms.size())
        << "\n";
    }
    cdf_plots.push_back(absl::StrCat(GnuplotQuote(file), " using 1:2 with steps lw 2 title '",
                                     PrefillKindName(kind), " (n=", ttft_ms.size(), ")'"));
  }
  if (cdf_plots.empty()) return absl::FailedPreconditionError("no successful request to plot");

  // Latency against offered rate per mode (sweeps).
  std::vector<std::string> rate_plots;
  if (sweep) {
    for (PrefillKind kind : kPrefillKinds) {
      const std::string name = PrefillKindName(kind);
      const std::string file = (dir / absl::StrCat("rate_", name, ".dat")).string();
      std::ofstream f(file);
      bool any = false;
      for (const PhaseResult& p : report.phases) {
        std::vector<const RequestRecord*> records;
        for (const RequestRecord& r : p.records) records.push_back(&r);
        const auto by_mode = SummarizeByMode(records, p.duration_s, report.slo);
        const auto it = by_mode.find(name);
        if (it == by_mode.end() || it->second.num_ok == 0) continue;
        const GroupSummary& g = it->second;
        f << p.spec.rate << " " << g.ttft.p50 * 1e3 << " " << g.ttft.p95 * 1e3 << " "
          << g.e2e.p50 * 1e3 << "\n";
        any = true;
      }
      if (!any) continue;
      rate_plots.push_back(absl::StrCat(
          GnuplotQuote(file), " using 1:2 with linespoints lw 2 title '", name, " TTFT p50'"));
      rate_plots.push_back(absl::StrCat(
          GnuplotQuote(file), " using 1:3 with linespoints dt 2 title '", name, " TTFT p95'"));
      rate_plots.push_back(absl::StrCat(
          GnuplotQuote(file), " using 1:4 with linespoints dt 3 title '", name, " E2E p50'"));
    }
  }

  const std::string script_path = (dir / "plot.gp").string();
  {
    std::ofstream gp(script_path);
    gp << "set terminal pngcairo size " << (rate_plots.empty() ? "800,560" : "1500,560")
       << " font 'sans,10'\n"
       << "set output " << GnuplotQuote(png_path) << "\n"
       << "set grid\nset key bottom right\n";
    if (!rate_plots.empty()) gp << "set multiplot layout 1,2\n";
    gp << "set title 'TTFT CDF (client-side, queue-inclusive)'\n"
       << "set xlabel 'TTFT (ms)'\nset ylabel 'fraction of requests'\nset yrange [0:1]\n"
       << "plot " << absl::StrJoin(cdf_plots, ", ") << "\n";
    if (!rate_plots.empty()) {
      gp << "set title 'latency vs offered rate'\nset xlabel 'offered rate (req/s)'\n"
         << "set ylabel 'ms'\nset autoscale y\nset key top left\n"
         << "plot " << absl::StrJoin(rate_plots, ", ") << "\n"
         << "unset multiplot\n";
    }
  }
  return RunGnuplot(script_path, dir);
}

}  // namespace ridgeserve::loadtest

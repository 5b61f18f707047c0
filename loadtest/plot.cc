#include "loadtest/plot.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace ridgeserve::loadtest {
namespace {

constexpr double kGnuplotTimeoutS = 60;

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    if (access(absl::StrCat(dir, "/", program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// gnuplot string literal in single quotes (a quote is doubled).
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

absl::Status RunGnuplot(const std::string& script) {
  std::vector<std::string> args = {"gnuplot", script};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (int err = posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv.data(), environ); err != 0) {
    return absl::InternalError(absl::StrCat("cannot start gnuplot: errno ", err));
  }
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kGnuplotTimeoutS);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError("gnuplot did not finish in 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("gnuplot failed (script ", script, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DrawPlot(const RunReport& report, const std::string& png_path) {
  if (!OnPath("gnuplot")) {
    return absl::FailedPreconditionError(
        "gnuplot is not installed (e.g. apt-get install gnuplot-nox); no plot drawn");
  }
  std::string dir_template =
      (std::filesystem::temp_directory_path() / "rs-loadtest-plot-XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError("cannot create a temporary directory for the plot data");
  }
  const std::filesystem::path dir = dir_template;
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
    cdf_plots.push_back(absl::StrCat(Quote(file), " using 1:2 with steps lw 2 title '",
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
      rate_plots.push_back(absl::StrCat(Quote(file), " using 1:2 with linespoints lw 2 title '",
                                        name, " TTFT p50'"));
      rate_plots.push_back(absl::StrCat(Quote(file), " using 1:3 with linespoints dt 2 title '",
                                        name, " TTFT p95'"));
      rate_plots.push_back(
          absl::StrCat(Quote(file), " using 1:4 with linespoints dt 3 title '", name, " E2E p50'"));
    }
  }

  const std::string script_path = (dir / "plot.gp").string();
  {
    std::ofstream gp(script_path);
    gp << "set terminal pngcairo size " << (rate_plots.empty() ? "800,560" : "1500,560")
       << " font 'sans,10'\n"
       << "set output " << Quote(png_path) << "\n"
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
  absl::Status status = RunGnuplot(script_path);
  if (status.ok()) std::filesystem::remove_all(dir);
  return status;
}

}  // namespace ridgeserve::loadtest

#include "engine/tools/eval_plot.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"
#include "engine/tools/gnuplot.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

// One marker: a method's setting at one prompt length (and tail, when several were run).
struct Marker {
  std::string title;
  // gnuplot's: 3 asterisk (exact), 7 disc (RidgeFill), 5 square (SpecPC), 9 triangle (SpecKV)
  int point_type = 7;
  double speedup = 1;
  double needle_accuracy = 0;
  Json distant_nll;  // null without distant-dependent tokens
};

std::string Number(const Json& v) { return v.is_null() ? "NaN" : absl::StrCat(v.get<double>()); }

std::vector<Marker> Markers(const Json& points) {
  std::set<int> lengths, tails;
  for (const Json& p : points) {
    lengths.insert(p["prompt_tokens"].get<int>());
    tails.insert(p["exact_tail_tokens"].get<int>());
  }
  // Which prompt the marker is on, where that is not the same for every marker.
  auto where = [&](const Json& p, bool with_tail) {
    std::string s;
    if (lengths.size() > 1) absl::StrAppend(&s, ", ", p["prompt_tokens"].get<int>(), " tokens");
    if (with_tail && tails.size() > 1) {
      absl::StrAppend(&s, ", tail ", p["exact_tail_tokens"].get<int>());
    }
    return s;
  };
  std::vector<Marker> markers;
  std::set<std::string> exact_done;
  for (const Json& p : points) {
    // Exact: one marker per prompt (the needle and distant-loss prompts depend on the tail).
    if (std::string title = absl::StrCat("exact", where(p, true));
        exact_done.insert(title).second) {
      markers.push_back({std::move(title), 3, 1.0, p["needle_exact_accuracy"].get<double>(),
                         p["distant_exact_nll"]});
    }
    const std::string method = p["method"].get<std::string>();
    Marker m;
    if (method == "ridgefill") {
      m.title = absl::StrCat("RidgeFill split ", p["split_layer"].get<int>(), ", tail ",
                             p["exact_tail_tokens"].get<int>(), where(p, false));
      m.point_type = 7;
    } else {
      const bool kv = method == "spec_kv";
      m.title = absl::StrCat(kv ? "SpecKV " : "SpecPC ", p["draft_model"].get<std::string>(),
                             ", C = ", p["budget"].get<int>(), where(p, true));
      m.point_type = kv ? 9 : 5;
    }
    m.speedup = p["speedup"].get<double>();
    m.needle_accuracy = p[absl::StrCat("needle_", method, "_accuracy")].get<double>();
    m.distant_nll = p[absl::StrCat("distant_", method, "_nll")];
    markers.push_back(std::move(m));
  }
  return markers;
}

}  // namespace

absl::Status DrawParetoPlot(const Json& pareto, const std::string& png_path) {
  RS_RETURN_IF_ERROR(CheckGnuplot());
  const std::vector<Marker> markers = Markers(pareto["points"]);
  if (markers.empty()) return absl::FailedPreconditionError("no points to plot");
  RS_ASSIGN_OR_RETURN(const std::filesystem::path dir, MakePlotDir("rs-eval-pareto-plot"));
  // One data file per marker: speedup, needle accuracy, distant-token NLL.
  std::vector<std::string> needle_plots, nll_plots;
  for (size_t i = 0; i < markers.size(); ++i) {
    const Marker& m = markers[i];
    const std::string file = (dir / absl::StrCat("marker_", i, ".dat")).string();
    std::ofstream(file) << m.speedup << " " << m.needle_accuracy << " " << Number(m.distant_nll)
                        << "\n";
    const std::string style = absl::StrCat(" with points pt ", m.point_type, " ps 2 lc ", i + 1,
                                           " title ", GnuplotQuote(m.title));
    needle_plots.push_back(absl::StrCat(GnuplotQuote(file), " using 1:2", style));
    nll_plots.push_back(absl::StrCat(GnuplotQuote(file), " using 1:3", style));
  }
  const std::string script_path = (dir / "plot.gp").string();
  {
    std::ofstream gp(script_path);
    gp << "set terminal pngcairo size 1600,600 font 'sans,10'\n"
       << "set output " << GnuplotQuote(png_path) << "\n"
       << "set datafile missing 'NaN'\nset grid\nset key outside right top\n"
       << "set xlabel 'TTFT speedup vs exact prefill'\n"
       << "set multiplot layout 1,2\n"
       << "set title 'needle accuracy (higher is better)'\nset ylabel 'needle accuracy'\n"
       << "set yrange [-0.05:1.05]\n"
       << "plot " << absl::StrJoin(needle_plots, ", ") << "\n"
       << "set title 'distant-token NLL (lower is better)'\nset ylabel 'NLL (nats)'\n"
       << "set autoscale y\n"
       << "plot " << absl::StrJoin(nll_plots, ", ") << "\n"
       << "unset multiplot\n";
  }
  return RunGnuplot(script_path, dir);
}

}  // namespace ridgeserve

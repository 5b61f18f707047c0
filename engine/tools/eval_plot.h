// ridgeserve-eval pareto --plot: the front as a PNG, TTFT speedup against needle accuracy (left)
// and against distant-token NLL (right), one marker per method and setting (exact at speedup 1),
// drawn by gnuplot when installed (engine/tools/gnuplot.h).
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_PLOT_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_PLOT_H_

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

// `pareto` is RunPareto's result. FailedPrecondition when gnuplot is not on PATH.
absl::Status DrawParetoPlot(const nlohmann::json& pareto, const std::string& png_path);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_PLOT_H_

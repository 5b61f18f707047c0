// Drawing PNGs with gnuplot from the command-line tools (ridgeserve-loadtest --plot,
// ridgeserve-eval pareto --plot): the tools write data files and a script into a temporary
// folder and run gnuplot on it. gnuplot is optional; without it a tool still does its job and
// says that no plot was drawn.
#ifndef RIDGESERVE_ENGINE_TOOLS_GNUPLOT_H_
#define RIDGESERVE_ENGINE_TOOLS_GNUPLOT_H_

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ridgeserve {

// FailedPrecondition ("gnuplot is not installed ...; no plot drawn") when gnuplot is not on
// PATH.
absl::Status CheckGnuplot();

// A new empty folder under the system's temporary directory, named prefix-XXXXXX.
absl::StatusOr<std::filesystem::path> MakePlotDir(const std::string& prefix);

// `s` as a gnuplot string literal in single quotes (a quote is doubled).
std::string GnuplotQuote(const std::string& s);

// Runs `gnuplot script_path`, then removes `plot_dir` (MakePlotDir's: the script and its data);
// DeadlineExceeded (the process killed) after 60 s, Internal when it fails, and then the folder
// stays for a look.
absl::Status RunGnuplot(const std::string& script_path, const std::filesystem::path& plot_dir);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_GNUPLOT_H_

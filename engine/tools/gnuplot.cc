#include "engine/tools/gnuplot.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace ridgeserve {
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

}  // namespace

absl::Status CheckGnuplot() {
  if (OnPath("gnuplot")) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "gnuplot is not installed (e.g. apt-get install gnuplot-nox); no plot drawn");
}

absl::StatusOr<std::filesystem::path> MakePlotDir(const std::string& prefix) {
  std::string dir = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError("cannot create a temporary directory for the plot data");
  }
  return std::filesystem::path(dir);
}

std::string GnuplotQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

absl::Status RunGnuplot(const std::string& script_path, const std::filesystem::path& plot_dir) {
  std::vector<std::string> args = {"gnuplot", script_path};
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
    return absl::InternalError(absl::StrCat("gnuplot failed (script ", script_path, ")"));
  }
  std::filesystem::remove_all(plot_dir);
  return absl::OkStatus();
}

}  // namespace ridgeserve

// The live progress line on stderr: requests done, errors, in flight and the completion rate.
// On a terminal one line is rewritten at most every 0.5 s; otherwise (a log file, CI) a new
// line is printed every 5 s, so logs stay short.
#ifndef RIDGESERVE_LOADTEST_PROGRESS_LINE_H_
#define RIDGESERVE_LOADTEST_PROGRESS_LINE_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace ridgeserve::loadtest {

struct ProgressState {
  std::string phase;  // "warm-up", "poisson 2 req/s (1/3)", ...
  int64_t issued = 0;
  int64_t limit = 0;  // requests the phase may issue
  int64_t done = 0;
  int64_t errors = 0;
  int64_t in_flight = 0;
  double elapsed_s = 0;
};

class ProgressLine {
 public:
  // `tty`: whether stderr is a terminal.
  explicit ProgressLine(bool tty);

  // Prints when the interval has passed since the last line, or when `force` and the counts
  // changed since the last line.
  void Update(const ProgressState& state, bool force = false);
  // Ends the current line (terminal only) so later output starts on a fresh one.
  void Finish();

 private:
  using Clock = std::chrono::steady_clock;

  bool tty_;
  double interval_s_;
  bool has_line_ = false;
  Clock::time_point last_print_{};
  int64_t last_done_ = 0;
  int64_t last_issued_ = 0;
};

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_PROGRESS_LINE_H_

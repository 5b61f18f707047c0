#include "loadtest/progress_line.h"

#include <cstdio>

namespace ridgeserve::loadtest {

ProgressLine::ProgressLine(bool tty) : tty_(tty), interval_s_(tty ? 0.5 : 5.0) {}

void ProgressLine::Update(const ProgressState& state, bool force) {
  const Clock::time_point now = Clock::now();
  const double since = has_line_ ? std::chrono::duration<double>(now - last_print_).count() : 0;
  const bool changed = state.done != last_done_ || state.issued != last_issued_;
  if (has_line_ && since < interval_s_ && !(force && changed)) return;
  const double rate = since > 0 ? static_cast<double>(state.done - last_done_) / since : 0;
  std::fprintf(stderr,
               "%s[%s] %.1f s | sent %lld/%lld | done %lld | errors %lld | in flight %lld | "
               "%.2f req/s%s",
               tty_ ? "\r\033[K" : "", state.phase.c_str(), state.elapsed_s,
               static_cast<long long>(state.issued), static_cast<long long>(state.limit),
               static_cast<long long>(state.done), static_cast<long long>(state.errors),
               static_cast<long long>(state.in_flight), rate, tty_ ? "" : "\n");
  std::fflush(stderr);
  has_line_ = true;
  last_print_ = now;
  last_done_ = state.done;
  last_issued_ = state.issued;
}

void ProgressLine::Finish() {
  if (tty_ && has_line_) std::fputc('\n', stderr);
  has_line_ = false;
  last_done_ = 0;
  last_issued_ = 0;
}

}  // namespace ridgeserve::loadtest

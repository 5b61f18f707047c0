#include "server/shutdown_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <utility>

namespace ridgeserve {
namespace {

// The write end, for the handler. One ShutdownSignal per process.
int g_pipe_write = -1;

// Byte written by the destructor to stop the reader; signal numbers are never 0.
constexpr unsigned char kStop = 0;

void OnSignal(int signal) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  // Async-signal-safe. A full pipe (hundreds of signals unread) only loses extra signals.
  [[maybe_unused]] const ssize_t n = write(g_pipe_write, &byte, 1);
  errno = saved_errno;
}

void SetHandler(int signal, void (*handler)(int)) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  [[maybe_unused]] const int rc = sigaction(signal, &action, nullptr);
  assert(rc == 0);
}

}  // namespace

ShutdownSignal::ShutdownSignal() {
  assert(g_pipe_write == -1 && "one ShutdownSignal per process");
  int fds[2];
  [[maybe_unused]] const int rc = pipe2(fds, O_CLOEXEC);
  assert(rc == 0);
  pipe_read_ = fds[0];
  g_pipe_write = fds[1];
  thread_ = std::thread([this] { Loop(); });
  SetHandler(SIGTERM, OnSignal);
  SetHandler(SIGINT, OnSignal);
  SetHandler(SIGHUP, OnSignal);
}

ShutdownSignal::~ShutdownSignal() {
  SetHandler(SIGTERM, SIG_DFL);
  SetHandler(SIGINT, SIG_DFL);
  SetHandler(SIGHUP, SIG_IGN);  // a late one must not kill a process that is exiting
  [[maybe_unused]] const ssize_t n = write(g_pipe_write, &kStop, 1);
  thread_.join();
  close(g_pipe_write);
  close(pipe_read_);
  g_pipe_write = -1;
}

void ShutdownSignal::Loop() {
  while (true) {
    unsigned char byte;
    const ssize_t n = read(pipe_read_, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1 || byte == kStop) return;
    if (byte == SIGHUP) {
      // Under the lock, so that SetReloadHandler(nullptr) returns only when no call is left.
      std::lock_guard<std::mutex> lock(mu_);
      if (reload_ == nullptr) {
        pending_reloads_ = 1;
      } else {
        reload_();
      }
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (count_++ == 0) first_signal_ = byte;
    cv_.notify_all();
  }
}

int ShutdownSignal::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return count_ > 0; });
  return first_signal_;
}

void ShutdownSignal::SetReloadHandler(std::function<void()> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  reload_ = std::move(handler);
  if (reload_ != nullptr && pending_reloads_ > 0) {
    pending_reloads_ = 0;
    reload_();
  }
}

int ShutdownSignal::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

}  // namespace ridgeserve

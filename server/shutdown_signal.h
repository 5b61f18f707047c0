// SIGTERM / SIGINT as ordinary events: a handler that only writes the signal number into a
// pipe (async-signal-safe), and a thread that reads the pipe and wakes whoever waits. So no
// real work runs in signal context, whichever thread the kernel picks to take the signal.
// (Blocking the signals and sigwait()ing is not enough here: libraries such as OpenBLAS start
// threads in their load-time constructors, before main() could block anything, and a signal
// delivered to one of those would kill the process.)
//
// SIGHUP is not a shutdown: it calls the reload handler (SetReloadHandler) on the reader
// thread, as daemons do to reread their files.
//
// At most one instance per process. Threading: every method is thread-safe.
#ifndef RIDGESERVE_SERVER_SHUTDOWN_SIGNAL_H_
#define RIDGESERVE_SERVER_SHUTDOWN_SIGNAL_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace ridgeserve {

class ShutdownSignal {
 public:
  // Installs the handlers (process-wide) and starts the reader thread.
  ShutdownSignal();
  // Restores the default handlers and stops the thread.
  ~ShutdownSignal();
  ShutdownSignal(const ShutdownSignal&) = delete;
  ShutdownSignal& operator=(const ShutdownSignal&) = delete;

  // Blocks until the first signal arrives; returns its number (SIGTERM or SIGINT).
  int Wait();
  // How many signals arrived so far (a second one cuts a drain short). SIGHUP not counted.
  int count() const;
  // Called on the reader thread for each SIGHUP, under this object's lock (so it must only
  // hand the work on, and must not call back); one SIGHUP that came before a handler was set
  // is delivered when it is. SetReloadHandler(nullptr) returns once no call is running.
  void SetReloadHandler(std::function<void()> handler);

 private:
  void Loop();

  int pipe_read_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  int first_signal_ = 0;
  std::function<void()> reload_;
  int pending_reloads_ = 0;
  std::thread thread_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_SHUTDOWN_SIGNAL_H_

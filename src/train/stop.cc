#include "train/stop.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

namespace tessera {

namespace {
StopFlag g_stop;
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free int");

void on_stop_signal(int sig) {
  int none = 0;
  if (g_stop.signal.compare_exchange_strong(none, sig)) {  // async-signal-safe: lock-free
    struct timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe (POSIX)
    g_stop.at_ns.store(int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec);
  }
  // SIGTERM is also how a hung process is ended: its handler is reset on
  // delivery (SA_RESETHAND), so a second one ends the process at once, and
  // SIGALRM's default action ends it if the stop takes longer than the grace.
  if (sig == SIGTERM) ::alarm(kStopGraceSeconds);
}
}  // namespace

StopFlag& install_stop_signals() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // no EINTR in the middle of a collective or a write
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  ::sigaction(SIGTERM, &sa, nullptr);
  return g_stop;
}

double seconds_since_signal(const StopFlag& f) {
  const int64_t at = f.at_ns.load();
  if (at == 0) return -1.0;
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec - at) / 1e9;
}

const char* stop_signal_name(int sig) {
  if (sig == SIGUSR1) return "SIGUSR1";
  if (sig == SIGTERM) return "SIGTERM";
  static thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

}  // namespace tessera

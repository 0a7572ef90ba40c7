#include "train/stop.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include <fmt/format.h>

#include "ckpt/checkpoint.h"

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

Status verify_stop_checkpoint(const std::string& dir, int64_t step) {
  Result<ckpt::Checkpoint> ck = ckpt::Checkpoint::open(dir);
  if (!ck.ok()) return ck.status();
  if (ck->step() != step) return Status::IOError(fmt::format("{}: holds step {}, not {}", dir, ck->step(), step));
  return ck->verify();
}

StopReport describe_stop(const char* name, int step, int steps, const std::string& dir, double secs,
                         const StopFlag& f) {
  const double since = seconds_since_signal(f);
  StopReport r;
  r.line = fmt::format("stopped by {} after step {} of {}: checkpoint {} published and verified in {:.2f} s{}; resume "
                       "with --resume latest\n",
                       name, step, steps, dir, secs,
                       since >= 0 ? fmt::format(" ({:.2f} s after the signal)", since) : std::string());
  r.record = {{"stopped_by", name},
              {"step", step},
              {"checkpoint", dir},
              {"save_and_verify_s", secs},
              {"signal_to_verified_s", since}};
  return r;
}

const char* stop_signal_name(int sig) {
  if (sig == SIGUSR1) return "SIGUSR1";
  if (sig == SIGTERM) return "SIGTERM";
  static thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

}  // namespace tessera

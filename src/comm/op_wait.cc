#include "comm/op_wait.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace tessera::comm {

std::string OpDesc::describe() const {
  std::string what = fmt::format("{} #{}", op, seq);
  if (std::strcmp(op, "barrier") == 0 || std::strcmp(op, "comm_dup") == 0) return what;
  if (is_bytes) return fmt::format("{} ({} bytes)", what, count);
  return fmt::format("{} ({} x {})", what, count, elem_name(type));
}

Poller::Poller(int64_t bytes, double gb_per_s)
    : start_(Clock::now()),
      spin_for_(std::chrono::microseconds(500) +
                std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(std::max<int64_t>(bytes, 0)) /
                                                              std::max(gb_per_s, 1e-3)))) {}

void Poller::pause(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (now - start_ < spin_for_) {
    sched_yield();
    return;
  }
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(std::max(deadline - now, Clock::duration(0)));
  std::this_thread::sleep_for(std::min(nap_, left));
  nap_ = std::min(nap_ * 2, std::chrono::microseconds(200));
}

}  // namespace tessera::comm

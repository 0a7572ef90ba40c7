#include "core/fault_plan.h"

#include <cerrno>
#include <charconv>
#include <chrono>
#include <string_view>
#include <thread>

#include <fmt/format.h>

namespace tessera {
namespace {

// The whole of s as a non-negative integer.
bool whole_number(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= 0;
}

}  // namespace

Result<FaultPlan> fault_plan_from_env(const std::function<const char*(const char*)>& get) {
  FaultPlan p;
  auto bad = [](const char* var, std::string_view value, const char* want) {
    return Status::InvalidArgument(fmt::format("{}='{}': want {}", var, value, want));
  };
  if (const char* v = get("TESSERA_FAULT"); v && *v) {
    const std::string_view s(v);
    const char* want = "stall@RANK:STEP or exit@RANK:STEP";
    const size_t at = s.find('@'), colon = s.find(':');
    int64_t rank = 0, step = 0;
    if (at == std::string_view::npos || colon == std::string_view::npos || colon < at ||
        !whole_number(s.substr(at + 1, colon - at - 1), &rank) || !whole_number(s.substr(colon + 1), &step))
      return bad("TESSERA_FAULT", s, want);
    const std::string_view kind = s.substr(0, at);
    if (kind == "stall") p.step_fault = FaultPlan::StepFault::kStall;
    else if (kind == "exit") p.step_fault = FaultPlan::StepFault::kExit;
    else return bad("TESSERA_FAULT", s, want);
    p.step_rank = static_cast<int>(rank);
    p.step = step;
  }
  if (const char* v = get("TESSERA_CKPT_FAULT"); v && *v) {
    const std::string_view s(v);
    const char* want = "eio or enospc, optionally @RANK";
    std::string_view kind = s;
    if (size_t at = s.find('@'); at != std::string_view::npos) {
      int64_t rank = 0;
      if (!whole_number(s.substr(at + 1), &rank)) return bad("TESSERA_CKPT_FAULT", s, want);
      p.ckpt_rank = static_cast<int>(rank);
      kind = s.substr(0, at);
    }
    if (kind == "eio") p.ckpt_errno = EIO;
    else if (kind == "enospc") p.ckpt_errno = ENOSPC;
    else return bad("TESSERA_CKPT_FAULT", s, want);
  }
  // The agent's restarted workers do not die again (TESSERA_ELASTIC_RESTART
  // is the agent's count of restarts).
  const char* restart = get("TESSERA_ELASTIC_RESTART");
  const bool first_worker = restart == nullptr || std::string_view(restart) == "0" || !*restart;
  if (const char* v = get("TESSERA_ELASTIC_FAULT"); v && *v && first_worker) {
    const std::string_view s(v);
    const size_t at = s.find('@');
    int64_t epoch = 0;
    if (at == std::string_view::npos || at == 0 || !whole_number(s.substr(at + 1), &epoch))
      return bad("TESSERA_ELASTIC_FAULT", s, "POINT@EPOCH");
    const std::string_view point = s.substr(0, at);
    bool known = false;
    for (const char* k : {"transfer", "before-log", "after-step", "rdzv", "rdzv-leader", "rdzv-record"})
      known = known || point == k;
    if (!known)
      return bad("TESSERA_ELASTIC_FAULT", s,
                 "POINT@EPOCH, POINT one of transfer, before-log, after-step, rdzv, rdzv-leader, rdzv-record");
    p.elastic_point = std::string(point);
    p.elastic_epoch = epoch;
  }
  if (const char* v = get("TESSERA_TEST_STOP_AT_START"); v && *v) {
    int64_t rank = 0;
    if (!whole_number(v, &rank)) return bad("TESSERA_TEST_STOP_AT_START", v, "a rank");
    p.stop_at_start_rank = static_cast<int>(rank);
  }
  if (const char* v = get("TESSERA_TRACE_PING"); v && *v) {
    const std::string_view s(v);
    if (s != "0" && s != "1") return bad("TESSERA_TRACE_PING", s, "0 or 1");
    p.trace_ping_every_rank = s == "1";
  }
  return p;
}

Status inject_step_fault(const FaultPlan* plan, int rank, int64_t step) {
  if (plan == nullptr || plan->step_fault == FaultPlan::StepFault::kNone || plan->step_rank != rank ||
      plan->step != step)
    return Status::OK();
  if (plan->step_fault == FaultPlan::StepFault::kStall) {
    std::this_thread::sleep_for(std::chrono::hours(1));
    return Status::OK();
  }
  if (plan->exit) plan->exit(3);
  return Status::Internal(fmt::format("test fault: exit at step {} on rank {} (the fault plan has no exit)", step, rank));
}

}  // namespace tessera

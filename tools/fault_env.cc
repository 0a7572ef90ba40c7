#include "tools/fault_env.h"

#include <signal.h>

#include <cstdlib>
#include <cstring>

namespace tessera::tools {

Result<const FaultPlan*> process_fault_plan() {
  static const Result<FaultPlan> plan = [] {
    Result<FaultPlan> p = fault_plan_from_env([](const char* name) { return std::getenv(name); });
    if (p.ok()) {
      p->exit = [](int status) { std::_Exit(status); };
      p->kill = [] { ::raise(SIGKILL); };
    }
    return p;
  }();
  if (!plan.ok()) return plan.status();
  return &plan.value();
}

void stop_at_start_if_asked(const FaultPlan& plan) {
  if (plan.stop_at_start_rank < 0) return;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank != nullptr && std::atoi(rank) == plan.stop_at_start_rank) ::raise(SIGSTOP);
}

}  // namespace tessera::tools

// The faults a test asks a process to inject, as one value (LevelDB passes a
// fault-injecting Env the same way). The CLI parses it once from the
// environment (fault_plan_from_env, called in tools/ only) and passes it in
// the options of the code that injects: the trainers (a stall or an exit at
// a step), the checkpointer (a failing shard write), the elastic worker and
// its rendezvous (a death at a named point), the trace session. Library code
// never reads these variables and never ends the process itself: a fault
// that ends it calls the plan's `exit` or `kill`, which the CLI sets; unset
// (a test in one process), the fault is an Internal error instead.
//
// The variables (docs: parallel.md, formats/checkpoint.md, elastic.md,
// monitoring.md):
//   TESSERA_FAULT=stall@RANK:STEP | exit@RANK:STEP   the trainers
//   TESSERA_CKPT_FAULT=eio | enospc [@RANK]          the shard write fails
//   TESSERA_ELASTIC_FAULT=POINT@EPOCH                an elastic worker dies
//                                                    (its agent's first one:
//                                                    TESSERA_ELASTIC_RESTART=0)
//   TESSERA_TEST_STOP_AT_START=RANK                  SIGSTOP before MPI starts
//   TESSERA_TRACE_PING=1                             every rank's clock measured
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"

namespace tessera {

struct FaultPlan {
  enum class StepFault { kNone, kStall, kExit };
  StepFault step_fault = StepFault::kNone;
  int step_rank = -1;
  int64_t step = -1;  // 0-based, before its backward

  int ckpt_errno = 0;  // EIO or ENOSPC; 0: none
  int ckpt_rank = -1;  // -1: every rank

  std::string elastic_point;  // transfer, before-log, after-step, rdzv, rdzv-leader, rdzv-record
  int64_t elastic_epoch = -1;

  int stop_at_start_rank = -1;  // the rank (OMPI_COMM_WORLD_RANK) that stops itself

  bool trace_ping_every_rank = false;

  // How a fault ends the process: exit(status) (std::_Exit), kill() (SIGKILL).
  std::function<void(int status)> exit;
  std::function<void()> kill;

  // The errno rank's shard writes fail with (0: none).
  int ckpt_errno_for(int rank) const { return ckpt_rank < 0 || ckpt_rank == rank ? ckpt_errno : 0; }
};

// The plan the variables ask for, read through `get` (std::getenv in the
// CLI). A variable set to something not understood is an InvalidArgument
// naming it and the forms it takes.
Result<FaultPlan> fault_plan_from_env(const std::function<const char*(const char*)>& get);

// The step fault, if the plan has one for this rank and step: a stall sleeps
// an hour (a hung rank); an exit calls plan.exit(3), or returns Internal when
// it is unset. nullptr: no plan.
Status inject_step_fault(const FaultPlan* plan, int rank, int64_t step);

}  // namespace tessera

// The CLI's fault plan (core/fault_plan.h): the test faults the environment
// asks for, parsed once, with the hooks that end this process (std::_Exit,
// SIGKILL). The only place the fault variables are read.
#pragma once

#include "core/fault_plan.h"
#include "core/status.h"

namespace tessera::tools {

// The plan, or InvalidArgument naming a variable set to something not
// understood. The same object every call; lives until the process ends.
Result<const FaultPlan*> process_fault_plan();

// Before MPI starts: the rank the plan names (TESSERA_TEST_STOP_AT_START)
// stops itself with SIGSTOP, as a rank that hangs in start-up would.
void stop_at_start_if_asked(const FaultPlan& plan);

}  // namespace tessera::tools

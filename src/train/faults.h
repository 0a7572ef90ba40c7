// Test hook for fault handling (tests/cli/dp_faults.sh, dlrm_trainer.sh):
// TESSERA_FAULT is "stall@RANK:STEP" (that rank sleeps for an hour before
// the 0-based step's backward) or "exit@RANK:STEP" (it exits at once with
// status 3). Unset or another rank or step: nothing.
#pragma once

namespace tessera {

void maybe_inject_fault(int rank, int step);

}  // namespace tessera

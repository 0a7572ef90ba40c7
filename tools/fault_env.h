// What the CLI takes from the environment for library code, which reads
// none of it: the fault plan (core/fault_plan.h: the test faults, parsed
// once, with the hooks that end this process, std::_Exit and SIGKILL) and
// the kernel choices (TESSERA_CUDA_ATTENTION, TESSERA_VERBOSE_MATMUL),
// passed to the backends as their options.
#pragma once

#include "core/fault_plan.h"
#include "elastic/elastic_trainer.h"
#include "core/status.h"

namespace tessera::tools {

// The plan, or InvalidArgument naming a variable set to something not
// understood. The same object every call; lives until the process ends.
Result<const FaultPlan*> process_fault_plan();

// Before MPI starts: the rank the plan names (TESSERA_TEST_STOP_AT_START)
// stops itself with SIGSTOP, as a rank that hangs in start-up would.
void stop_at_start_if_asked(const FaultPlan& plan);

// TESSERA_CUDA_ATTENTION=flash|plain (cuda::set_attention_preference; another
// value is a warning and flash), TESSERA_VERBOSE_MATMUL=1
// (cpu::set_verbose_matmul) and TESSERA_HUGE_PAGES=0 (set_huge_pages(false):
// weights, arenas and the read roof in 4 KiB pages). Called once at
// start-up, before any model.
void apply_kernel_choices_from_env();

// The options `tessera elastic` passes its worker in the environment
// (TESSERA_ELASTIC_STORE, _JOB, _MIN, _MAX, _LAST_CALL, _RDZV_TIMEOUT);
// false when this process was not started by `tessera elastic`.
bool elastic_options_from_env(elastic::ElasticOptions* o);

}  // namespace tessera::tools

// Elastic data-parallel training (`tessera elastic ... -- train`): the
// worker's side. The worker itself takes part in rendezvous rounds
// (elastic/rendezvous.h); its agent (tools/cmd_elastic.cc) only starts it,
// watches it and restarts it. Plain data parallelism: every worker holds the
// whole model and AdamW state, so the survivors of a failure go on from the
// last step they completed, in memory, and a joiner gets the state by a
// broadcast over the new communicator. Only dp changes; the global batch
// (parallel.dp x train.grad_accum micro-batches of train.micro_batch rows)
// stays the same, split over the current workers. docs/elastic.md.
#pragma once

#include <cstdio>
#include <string>

#include "comm/rendezvous/store.h"
#include "core/fault_plan.h"
#include "core/status.h"
#include "train/config.h"

namespace tessera::elastic {

struct ElasticOptions {
  comm::StoreAddress store;  // embedded or Redis
  std::string job;
  int min = 1, max = 1;
  double last_call_s = 1.0;
  double rdzv_timeout_s = 60.0;
  const FaultPlan* faults = nullptr;  // a test's deaths (rendezvous.h, fault_point); not owned
};

// The CLI reads these options from the environment `tessera elastic` sets
// (tools/fault_env.h: elastic_options_from_env).

struct ElasticSummary {
  double last_train_loss = 0.0;
  int rounds = 0;
  std::string weights_path;  // written by the last round's rank 0 (empty elsewhere)
  // This worker came back from a failed step after the job had finished
  // without it (JOB/done): nothing left to do, not an error.
  bool finished_without_this_worker = false;
};

// Trains c.steps steps. Errors: an unsupported config (InvalidArgument, one
// line), fewer than min workers for the rendezvous timeout
// (ResourceExhausted), the store unreachable (Unavailable).
Result<ElasticSummary> run_elastic_training(const TrainConfig& c, const ElasticOptions& o, std::FILE* out);

}  // namespace tessera::elastic

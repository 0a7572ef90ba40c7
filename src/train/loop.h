// The loop every trainer runs, as Megatron-LM's pretrain() is the one loop
// every model plugs its steps into. A TrainTask is a model's part (its step,
// its log line, its evaluation, its save, its stop); run_loop decides when
// each happens, the same way for GPT and DLRM:
//
//   for each step from o.start to o.steps:
//     task.step(step)                        one optimizer step (0-based)
//     task.log(done, flush)                  done = step + 1; the task keeps its
//                                            own cadence, flush: write what it holds
//     a stop signal on any rank (agreed in the step's result), before the
//     last step: task.stop_on_signal(done) and the loop ends (kSignal)
//     task.evaluate(done)                    every o.eval_every steps and at the end
//     task.save(done, stop_at, last)         the task's saves (train/saves.h)
//     train.stop_at: the loop ends after that step's save (kStoppedAt)
//
// Collective: every rank runs the same loop, so every call is made by every
// rank in the same order. The model's own setup, its first evaluation and
// its end (final weights, the plan check) stay with the trainer.
#pragma once

#include <cstdio>

#include "core/status.h"

namespace tessera {

struct StepResult {
  bool stop_signal = false;  // any rank received a stop signal (every rank sees the same)
};

class TrainTask {
 public:
  virtual ~TrainTask() = default;
  virtual Result<StepResult> step(int step) = 0;
  virtual Status log(int done, bool flush) = 0;
  virtual Status evaluate(int done) = 0;
  virtual Status save(int done, bool stop_at, bool last) = 0;
  virtual Status stop_on_signal(int done) = 0;
};

struct LoopOptions {
  int start = 0;       // the first step (0-based): a resumed run's
  int steps = 0;       // train.steps
  int stop_at = 0;     // train.stop_at (0: none)
  int eval_every = 0;  // train.eval_every (0: only at the end)
};

enum class LoopEnd { kFinished, kStoppedAt, kSignal };

// `out`: rank 0's console (null elsewhere), for the stop_at line.
Result<LoopEnd> run_loop(TrainTask& task, const LoopOptions& o, std::FILE* out);

}  // namespace tessera

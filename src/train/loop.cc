#include "train/loop.h"

namespace tessera {

Result<LoopEnd> run_loop(TrainTask& task, const LoopOptions& o, std::FILE* out) {
  for (int step = o.start; step < o.steps; step++) {
    const int done = step + 1;
    ASSIGN_OR_RETURN(StepResult r, task.step(step));
    const bool stop_at = o.stop_at > 0 && done == o.stop_at && done < o.steps;
    const bool last = done == o.steps || stop_at;
    const bool signal = r.stop_signal && done < o.steps;
    RETURN_IF_ERROR(task.log(done, last || signal));
    if (signal) {
      RETURN_IF_ERROR(task.stop_on_signal(done));
      return LoopEnd::kSignal;
    }
    if (last || (o.eval_every > 0 && done % o.eval_every == 0)) RETURN_IF_ERROR(task.evaluate(done));
    RETURN_IF_ERROR(task.save(done, stop_at, last));
    if (stop_at) {
      if (out) {
        std::fprintf(out, "stopped after step %d of %d (train.stop_at)\n", done, o.steps);
        std::fflush(out);
      }
      return LoopEnd::kStoppedAt;
    }
  }
  return LoopEnd::kFinished;
}

}  // namespace tessera

// Pipeline parallelism over the mesh's pp axis: each stage holds a range of
// layers (GPT's ModelShard) and runs its share of every micro-batch's forward
// and backward, passing activations to the next stage and their gradients
// back, point to point.
//
// Schedules (one optimizer step of m micro-batches, stage s of p):
//   GPipe: all m forwards, then all m backwards. Keeps m micro-batches'
//          activations.
//   1F1B:  min(p-s-1, m) warm-up forwards, then one forward and one backward
//          alternately, then the remaining backwards (PipeDream-flush, as in
//          Megatron-LM). Keeps at most p-s micro-batches' activations.
// Both run backwards in micro-batch order, so gradients accumulate in the
// same order and the two give the same losses and parameters.
//
// Deadlock freedom: sends are asynchronous and only waited for before their
// buffer is reused or at the end of the step; receives block in schedule
// order. Each stage's order is a topological order of the micro-batch
// dependency graph, so some stage can always make progress, for any p and m.
//
// Not thread-safe: the training thread drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "comm/communicator.h"
#include "nn/gpt.h"

namespace tessera {

enum class PipelineSchedule { k1F1B, kGPipe };
Result<PipelineSchedule> parse_pipeline_schedule(const std::string& name);  // "1f1b" or "gpipe"

struct PipeOp {
  bool forward;
  int micro;
};
// The most micro-batches of one step (train.grad_accum): message tags
// 2*micro and 2*micro+1 stay below the evaluation tag (2^20), and a step of
// more micro-batches than this is not a job anyone runs (issue #18 item 1:
// grad_accum=1e9 was OOM-killed building its schedule).
constexpr int kMaxMicroBatches = 1 << 18;

// A stage's schedule is 2 * micro_batches operations; pipeline_op() gives
// the i-th (0 <= i < pipeline_op_count) without building the list, so the
// executor needs no memory for it; pipeline_ops() is the list, for tests.
int64_t pipeline_op_count(int micro_batches);
PipeOp pipeline_op(PipelineSchedule s, int stages, int stage, int micro_batches, int64_t i);
std::vector<PipeOp> pipeline_ops(PipelineSchedule s, int stages, int stage, int micro_batches);
// Most micro-batches in flight (forward done, backward not) on the stage, at
// least 1; closed form (GPipe: m; 1F1B: min(p - s, m)).
int pipeline_slots(PipelineSchedule s, int stages, int stage, int micro_batches);

// Layers of each stage: `counts` if given (must sum to L, each >= 1), else
// balanced (the first L % p stages get one more). Error names what is wrong.
Result<std::vector<int>> stage_layer_counts(int layers, int stages, const std::vector<int>& counts);

class Pipeline {
 public:
  // model is this stage's shard; pp's rank is the stage. Both outlive this.
  Pipeline(GPT& model, comm::Communicator& pp, PipelineSchedule schedule);

  // Fills micro-batch `micro`'s token ids, (B,T) each.
  using FillFn = std::function<Status(int micro, int* inputs, int* targets)>;
  // Forward and backward of m micro-batches of (B,T); before_backward(micro)
  // runs before each backward (data parallelism's begin_backward). *loss_sum
  // gets the sum of the micro-batches' mean losses on the last stage, 0
  // elsewhere. Gradients accumulate into the model (loss_scale each).
  Status train_step(int m, int B, int T, float loss_scale, const FillFn& fill,
                    const std::function<void(int micro)>& before_backward, double* loss_sum);
  // Forward of one batch through all stages (evaluation): *loss on the last
  // stage, 0 elsewhere.
  Status forward_only(int B, int T, const int* inputs, const int* targets, float* loss);

  // Since the last take_times(): the bubble, i.e. seconds this stage was
  // idle in train_step() (its span, which ends with the stages meeting at a
  // barrier, minus its forwards, backwards and sends: waiting for a
  // neighbour's activation or gradient, transfers included), and seconds in
  // sends (posting and completing). Per stage, the bubble of both schedules
  // is (pp-1)/m of the compute in theory (equal stages, free transfers).
  struct Times {
    double bubble = 0.0, p2p = 0.0;
  };
  Times take_times();

 private:
  // Message kinds of the trace's send/recv ids.
  enum class Msg { kActivation, kGradient, kEval };
  // peer: the pp rank; micro: the micro-batch (kEval: the evaluation batch).
  Status recv(float* dst, int64_t n, int peer, int tag, Msg kind, int64_t micro);
  std::unique_ptr<comm::Work> send_async(const float* src, int64_t n, int peer, int tag, Msg kind, int64_t micro);
  Status wait_send(std::unique_ptr<comm::Work>& w);
  // The id a send and its receive share in the trace (args "msg" and the
  // flow's id): the step, the kind, the micro-batch, this pipeline (the
  // world rank of its stage 0) and the link (its lower stage).
  uint64_t msg_id(Msg kind, int64_t micro, int peer) const;

  GPT& model_;
  comm::Communicator& pp_;
  PipelineSchedule schedule_;
  int stage_, stages_;
  Times times_;
  std::vector<int> in_, tg_;  // one micro-batch's tokens
  int64_t eval_batches_ = 0;  // forward_only() calls so far: the kEval messages' number
  std::vector<std::unique_ptr<comm::Work>> act_sends_, grad_sends_;  // per slot
};

}  // namespace tessera

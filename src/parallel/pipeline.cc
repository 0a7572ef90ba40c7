#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "obs/trace.h"

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// Message tags: activations and gradients of micro-batch i; evaluation.
int act_tag(int micro) { return 2 * micro; }
int grad_tag(int micro) { return 2 * micro + 1; }
constexpr int kEvalTag = 1 << 20;
}  // namespace

Result<PipelineSchedule> parse_pipeline_schedule(const std::string& name) {
  if (name == "1f1b") return PipelineSchedule::k1F1B;
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  return Status::InvalidArgument(fmt::format("parallel.schedule must be \"1f1b\" or \"gpipe\", got \"{}\"", name));
}

int64_t pipeline_op_count(int m) { return 2 * int64_t{m}; }

PipeOp pipeline_op(PipelineSchedule s, int stages, int stage, int m, int64_t i) {
  if (s == PipelineSchedule::kGPipe) return i < m ? PipeOp{true, static_cast<int>(i)} : PipeOp{false, static_cast<int>(i - m)};
  // 1F1B: w warm-up forwards; then m - w (forward, backward) pairs, the pair
  // k being forward w + k and backward k; then the last w backwards.
  const int64_t w = std::min(stages - stage - 1, m);
  if (i < w) return {true, static_cast<int>(i)};
  const int64_t k = (i - w) / 2;
  if (k < m - w) return (i - w) % 2 == 0 ? PipeOp{true, static_cast<int>(w + k)} : PipeOp{false, static_cast<int>(k)};
  return {false, static_cast<int>(i - m)};  // i - 2(m - w) - w + (m - w) backwards done before it
}

std::vector<PipeOp> pipeline_ops(PipelineSchedule s, int stages, int stage, int m) {
  std::vector<PipeOp> ops;
  ops.reserve(pipeline_op_count(m));
  for (int64_t i = 0; i < pipeline_op_count(m); i++) ops.push_back(pipeline_op(s, stages, stage, m, i));
  return ops;
}

int pipeline_slots(PipelineSchedule s, int stages, int stage, int m) {
  // GPipe keeps every micro-batch; 1F1B its warm-up forwards plus the one of
  // the steady state's pair (p - s), or all m when there are fewer.
  const int most = s == PipelineSchedule::kGPipe ? m : std::min(stages - stage, m);
  return std::max(most, 1);
}

Result<std::vector<int>> stage_layer_counts(int layers, int stages, const std::vector<int>& counts) {
  if (stages > layers)
    return Status::InvalidArgument(
        fmt::format("parallel.pp ({}) exceeds model.layers ({}): every stage needs a layer", stages, layers));
  if (counts.empty()) {
    std::vector<int> c(stages, layers / stages);
    for (int i = 0; i < layers % stages; i++) c[i]++;
    return c;
  }
  if (static_cast<int>(counts.size()) != stages)
    return Status::InvalidArgument(
        fmt::format("parallel.stages lists {} stage(s) but parallel.pp is {}", counts.size(), stages));
  int sum = 0;
  for (int c : counts) {
    if (c < 1) return Status::InvalidArgument(fmt::format("parallel.stages: every stage needs a layer, got {}", c));
    sum += c;
  }
  if (sum != layers)
    return Status::InvalidArgument(
        fmt::format("parallel.stages adds up to {} layers but model.layers is {}", sum, layers));
  return counts;
}

Pipeline::Pipeline(GPT& model, comm::Communicator& pp, PipelineSchedule schedule)
    : model_(model), pp_(pp), schedule_(schedule), stage_(pp.rank()), stages_(pp.size()) {}

Pipeline::Times Pipeline::take_times() {
  Times t = times_;
  times_ = Times{};
  return t;
}

uint64_t Pipeline::msg_id(Msg kind, int64_t micro, int peer) const {
  using obs::trace::mix_id;
  const uint64_t step = static_cast<uint64_t>(obs::trace::current_step() + 1);
  uint64_t h = mix_id(step);
  h = mix_id(h ^ (static_cast<uint64_t>(kind) << 40) ^ static_cast<uint64_t>(micro));
  h = mix_id(h ^ static_cast<uint64_t>(pp_.world_rank_of(0)));
  return mix_id(h ^ static_cast<uint64_t>(std::min(stage_, peer)));
}

Status Pipeline::recv(float* dst, int64_t n, int peer, int tag, Msg kind, int64_t micro) {
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  if (!obs::trace::enabled()) return pp_.recv(dst, bytes, peer, tag);
  const uint64_t id = msg_id(kind, micro, peer);
  obs::trace::Span span(kind == Msg::kGradient ? "recv grad" : "recv act", "pipeline",
                        {{"peer", pp_.world_rank_of(peer)}, {"bytes", bytes}, {"micro", micro},
                         {"msg", static_cast<int64_t>(id)}});
  obs::trace::flow_end("p2p", "pipeline", id, span.begin_ns());
  return pp_.recv(dst, bytes, peer, tag);
}

std::unique_ptr<comm::Work> Pipeline::send_async(const float* src, int64_t n, int peer, int tag, Msg kind,
                                                 int64_t micro) {
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  if (!obs::trace::enabled()) return pp_.send_async(src, bytes, peer, tag);
  const uint64_t id = msg_id(kind, micro, peer);
  obs::trace::Span span(kind == Msg::kGradient ? "send grad" : "send act", "pipeline",
                        {{"peer", pp_.world_rank_of(peer)}, {"bytes", bytes}, {"micro", micro},
                         {"msg", static_cast<int64_t>(id)}});
  obs::trace::flow_start("p2p", "pipeline", id, span.begin_ns());
  return pp_.send_async(src, bytes, peer, tag);
}

Status Pipeline::wait_send(std::unique_ptr<comm::Work>& w) {
  if (!w) return Status::OK();
  obs::trace::Span span("send wait", "pipeline");
  auto t0 = Clock::now();
  Status st = w->wait();
  w.reset();
  times_.p2p += since(t0);
  return st;
}

Status Pipeline::train_step(int m, int B, int T, float loss_scale, const FillFn& fill,
                            const std::function<void(int)>& before_backward, double* loss_sum) {
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const int slots = pipeline_slots(schedule_, stages_, stage_, m);
  RETURN_IF_ERROR(model_.try_reserve_activations(B, T, slots));
  const int64_t BTC = int64_t{B} * T * model_.config().channels;
  in_.resize(int64_t{B} * T);
  tg_.resize(int64_t{B} * T);
  act_sends_.resize(model_.activation_slots());
  grad_sends_.resize(model_.activation_slots());
  *loss_sum = 0.0;
  const auto start = Clock::now();
  double fb = 0.0, p2p_before = times_.p2p;  // seconds in this stage's forwards and backwards; in sends
  // The schedule is computed op by op: grad_accum may be large, and a list
  // of its 2m ops would be allocated for nothing.
  for (int64_t i = 0; i < pipeline_op_count(m); i++) {
    const PipeOp op = pipeline_op(schedule_, stages_, stage_, m, i);
    const int slot = op.micro % slots;
    if (op.forward) {
      RETURN_IF_ERROR(wait_send(act_sends_[slot]));  // the slot's previous output
      if (!first)
        RETURN_IF_ERROR(recv(model_.stage_input(slot), BTC, stage_ - 1, act_tag(op.micro), Msg::kActivation, op.micro));
      RETURN_IF_ERROR(fill(op.micro, in_.data(), tg_.data()));
      float loss = 0.0f;
      auto t0 = Clock::now();
      {
        obs::trace::Span span("forward", "compute", {{"micro", op.micro}});
        RETURN_IF_ERROR(model_.forward_stage(slot, in_.data(), tg_.data(), B, T, &loss));
      }
      fb += since(t0);
      *loss_sum += loss;
      if (!last) {
        auto t0 = Clock::now();
        act_sends_[slot] =
            send_async(model_.stage_output(slot), BTC, stage_ + 1, act_tag(op.micro), Msg::kActivation, op.micro);
        times_.p2p += since(t0);
      }
    } else {
      if (!last)
        RETURN_IF_ERROR(recv(model_.stage_output_grad(), BTC, stage_ + 1, grad_tag(op.micro), Msg::kGradient, op.micro));
      before_backward(op.micro);
      RETURN_IF_ERROR(wait_send(grad_sends_[slot]));  // the slot's previous input gradient
      auto t0 = Clock::now();
      {
        obs::trace::Span span("backward", "compute", {{"micro", op.micro}});
        RETURN_IF_ERROR(model_.backward_stage(slot, loss_scale));
      }
      fb += since(t0);
      if (!first) {
        auto t0 = Clock::now();
        grad_sends_[slot] =
            send_async(model_.stage_input_grad(slot), BTC, stage_ - 1, grad_tag(op.micro), Msg::kGradient, op.micro);
        times_.p2p += since(t0);
      }
    }
  }
  for (auto& w : act_sends_) RETURN_IF_ERROR(wait_send(w));
  for (auto& w : grad_sends_) RETURN_IF_ERROR(wait_send(w));
  if (stages_ > 1) {
    obs::trace::Span span("pipeline flush", "pipeline");
    // The stages finish at different times (the last one first); meet here
    // so each stage's idle time is counted as bubble, not as the wait in
    // whatever collective comes next.
    RETURN_IF_ERROR(pp_.barrier());
    times_.bubble += since(start) - fb - (times_.p2p - p2p_before);
  }
  return Status::OK();
}

Status Pipeline::forward_only(int B, int T, const int* inputs, const int* targets, float* loss) {
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  RETURN_IF_ERROR(model_.try_reserve_activations(B, T, 1));
  const int64_t BTC = int64_t{B} * T * model_.config().channels;
  const int64_t batch = eval_batches_++;
  *loss = 0.0f;
  if (!first) {
    auto t0 = Clock::now();
    RETURN_IF_ERROR(recv(model_.stage_input(0), BTC, stage_ - 1, kEvalTag, Msg::kEval, batch));
    times_.bubble += since(t0);
  }
  {
    obs::trace::Span span("forward", "compute", {{"eval_batch", batch}});
    RETURN_IF_ERROR(model_.forward_stage(0, inputs, targets, B, T, loss));
  }
  if (!last) {
    auto t0 = Clock::now();
    Status st = send_async(model_.stage_output(0), BTC, stage_ + 1, kEvalTag, Msg::kEval, batch)->wait();
    times_.p2p += since(t0);
    RETURN_IF_ERROR(st);
  }
  return Status::OK();
}

}  // namespace tessera

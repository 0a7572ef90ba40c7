#include "parallel/data_parallel.h"

#include <algorithm>

#include <fmt/format.h>
#include <xxhash.h>

#include "nn/ops_table.h"
#include "obs/trace.h"
#include "optim/zero.h"
#include "tensor/device_memory.h"

namespace tessera {

namespace {
// The per-layer parameter kinds, in arena order.
constexpr int kFirstLayerParam = kLn1W, kLastLayerParam = kFcProjB;
}  // namespace

ParamSpace gpt_param_space(GPT& model) {
  const Arena& params = model.params();
  ParamSpace s;
  s.params = reinterpret_cast<float*>(params.base());
  s.grads = reinterpret_cast<float*>(model.grads().base());
  s.count = static_cast<int64_t>(params.bytes() / sizeof(float));
  s.device = model.device();
  ParamPtrs p = model.param_ptrs(), g = model.grad_ptrs();
  for (int id = 0; id < kNumParams; id++) {
    const size_t n = static_cast<size_t>(params.tensor(id).numel());
    s.groups.push_back({{p[id], n}, {g[id], n}, GPT::decays(id), model.counts_in_norm(id)});
  }
  return s;
}

AdamWKernel gpt_adamw_kernel(const GPT& model) { return ops_for(model.backend()).adamw_update; }

std::vector<std::vector<GradSpan>> gpt_ready_groups(GPT& model, std::vector<int>* events) {
  const ModelShard& shard = model.shard();
  const int Ll = shard.layer_end - shard.layer_begin;
  const Arena& grads = model.grads();
  ParamPtrs g = model.grad_ptrs();
  auto whole = [&](int id) { return GradSpan{g[id], grads.tensor(id).numel()}; };
  std::vector<std::vector<GradSpan>> groups;
  events->clear();
  if (shard.last) {
    events->push_back(GradListener::kFinalNorm);
    std::vector<GradSpan> e;
    for (int id : {kLnfW, kLnfB, kLmHead})  // the untied head's gradient is final with the norm's
      if (grads.tensor(id).numel() > 0) e.push_back(whole(id));
    groups.push_back(std::move(e));
  }
  for (int l = Ll - 1; l >= 0; l--) {
    std::vector<GradSpan> e;
    for (int id = kFirstLayerParam; id <= kLastLayerParam; id++) {
      int64_t per_layer = grads.tensor(id).numel() / Ll;
      e.push_back({g[id] + l * per_layer, per_layer});
    }
    events->push_back(shard.layer_begin + l);
    groups.push_back(std::move(e));
  }
  if (shard.first || shard.last) {
    events->push_back(GradListener::kEmbeddings);
    std::vector<GradSpan> e;
    for (int id : {kWte, kWpe})
      if (grads.tensor(id).numel() > 0) e.push_back(whole(id));
    groups.push_back(std::move(e));
  }
  return groups;
}

namespace {
// ZeRO exchanges the flat arena, not buckets.
std::vector<std::vector<GradSpan>> groups_for(GPT& model, const DataParallelOptions& o, std::vector<int>* events) {
  if (o.zero == 1) return {};
  return gpt_ready_groups(model, events);
}
}  // namespace

Result<std::unique_ptr<DataParallel>> DataParallel::create(GPT& model, comm::Communicator& comm,
                                                           const DataParallelOptions& o) {
  std::vector<int> events;
  std::vector<std::vector<GradSpan>> groups = groups_for(model, o, &events);
  ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> reducer,
                   GradientReducer::create(comm, std::move(groups), {o.bucket_bytes, model.device()}));
  ASSIGN_OR_RETURN(HostReduce host_reduce, HostReduce::create(comm));
  return std::unique_ptr<DataParallel>(
      new DataParallel(model, comm, o, std::move(events), std::move(reducer), std::move(host_reduce)));
}

DataParallel::DataParallel(GPT& model, comm::Communicator& comm, const DataParallelOptions& o,
                           std::vector<int> events, std::unique_ptr<GradientReducer> reducer, HostReduce host_reduce)
    : model_(model),
      comm_(comm),
      opts_(o),
      events_(std::move(events)),
      reducer_(std::move(reducer)),
      host_reduce_(std::move(host_reduce)) {
  model_.set_grad_listener(this);
}

DataParallel::~DataParallel() { model_.set_grad_listener(nullptr); }

void DataParallel::on_grads_ready(int what) {
  auto it = std::find(events_.begin(), events_.end(), what);
  if (it != events_.end()) reducer_->ready(static_cast<int>(it - events_.begin()));
}

Status DataParallel::finish_gradients() {
  obs::trace::Span span(opts_.zero == 0 ? "allreduce wait" : "reduce_scatter", "comm");
  if (opts_.zero == 0) return reducer_->finish();
  // The arena's slack covers the padding to dp*S floats.
  const int64_t flat = static_cast<int64_t>(model_.grads().bytes() / sizeof(float));
  return reducer_->reduce_scatter_flat(reinterpret_cast<float*>(model_.grads().base()),
                                       zero1_shard_floats(flat, comm_.size()));
}

Status DataParallel::sync_parameters() {
  if (comm_.size() == 1) return Status::OK();
  RETURN_IF_ERROR(comm_.broadcast(model_.params().base(), static_cast<int64_t>(model_.params().bytes()),
                                  comm::ElemType::kU8, 0));
  return check_parameters_identical();
}

Status DataParallel::check_parameters_identical() {
  if (comm_.size() == 1) return Status::OK();
  const Arena& params = model_.params();
  uint64_t h = 0;
  if (model_.device() != Device::kCPU) {
    // Hash a host copy (blocking, after the kernels queued so far).
    std::vector<char> host(params.bytes());
    RETURN_IF_ERROR(try_copy_to_host(model_.device(), host.data(), params.base(), host.size()));
    h = XXH3_64bits(host.data(), host.size());
  } else {
    h = XXH3_64bits(params.base(), params.bytes());
  }
  uint64_t lo = h, hi = h;
  RETURN_IF_ERROR(host_reduce_.all_reduce(&lo, 1, comm::ElemType::kU64, comm::ReduceOp::kMin));
  RETURN_IF_ERROR(host_reduce_.all_reduce(&hi, 1, comm::ElemType::kU64, comm::ReduceOp::kMax));
  if (lo != hi)
    return Status::Internal(fmt::format("parameters differ across data-parallel ranks (xxhash64 {:016x} on rank {}; "
                                        "min {:016x}, max {:016x})",
                                        h, comm_.rank(), lo, hi));
  return Status::OK();
}

}  // namespace tessera

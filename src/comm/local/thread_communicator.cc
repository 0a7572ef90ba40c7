#include "comm/local/thread_communicator.h"
#include "comm/done_work.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace tessera::comm {
namespace {

std::unique_ptr<Work> done(Status st) { return std::make_unique<DoneWork>(std::move(st)); }

template <typename T>
void combine_as(std::byte* acc, const std::byte* in, int64_t count, ReduceOp op) {
  for (int64_t i = 0; i < count; i++) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    a = op == ReduceOp::kSum ? static_cast<T>(a + b) : op == ReduceOp::kMax ? std::max(a, b) : std::min(a, b);
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

void combine(std::byte* acc, const std::byte* in, int64_t count, ElemType type, ReduceOp op) {
  switch (type) {
    case ElemType::kF32: return combine_as<float>(acc, in, count, op);
    case ElemType::kF64: return combine_as<double>(acc, in, count, op);
    case ElemType::kI32: return combine_as<int32_t>(acc, in, count, op);
    case ElemType::kI64: return combine_as<int64_t>(acc, in, count, op);
    case ElemType::kU64: return combine_as<uint64_t>(acc, in, count, op);
    case ElemType::kU8: return combine_as<uint8_t>(acc, in, count, op);
  }
}

}  // namespace

ThreadHub::ThreadHub(int n, std::chrono::milliseconds timeout) : n_(n), timeout_(timeout), slots_(n) {}

Status ThreadHub::barrier(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = timeout_;
  std::unique_lock lock(mu_);
  const int64_t generation = generation_;
  if (++arrived_ == n_) {
    arrived_ = 0;
    generation_++;
    cv_.notify_all();
    return Status::OK();
  }
  if (!cv_.wait_for(lock, timeout, [&] { return generation_ != generation; }))
    return Status::Unavailable(fmt::format("thread hub: barrier timed out after {} ms", timeout.count()));
  return Status::OK();
}

Status ThreadHub::exchange(int rank, const void* data, size_t bytes, std::vector<std::vector<std::byte>>* all,
                          std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(mu_);
    slots_[rank].assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + bytes);
  }
  if (Status st = barrier(timeout); !st.ok()) return st;
  {
    std::lock_guard lock(mu_);
    *all = slots_;
  }
  return barrier(timeout);
}

void ThreadHub::post(int from, int to, int tag, const void* data, size_t bytes) {
  std::lock_guard lock(mu_);
  auto* p = static_cast<const std::byte*>(data);
  mail_[{from, to, tag}].emplace_back(p, p + bytes);
  cv_.notify_all();
}

Status ThreadHub::take(int from, int to, int tag, void* data, size_t bytes, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = timeout_;
  std::unique_lock lock(mu_);
  auto& box = mail_[{from, to, tag}];
  if (!cv_.wait_for(lock, timeout, [&] { return !box.empty(); }))
    return Status::Unavailable(
        fmt::format("thread hub: recv from {} (tag {}) timed out after {} ms", from, tag, timeout.count()));
  if (box.front().size() != bytes)
    return Status::InvalidArgument(
        fmt::format("thread hub: a message of {} bytes for a recv of {}", box.front().size(), bytes));
  std::memcpy(data, box.front().data(), bytes);
  box.pop_front();
  return Status::OK();
}

ThreadCommunicator::ThreadCommunicator(ThreadHub& hub, int rank, std::string name)
    : hub_(hub), rank_(rank), name_(std::move(name)) {}

Status ThreadCommunicator::reduce(const void* send, int64_t count, ElemType type, ReduceOp op,
                                  std::vector<std::byte>* acc) {
  if (count < 0) return Status::InvalidArgument("negative count");
  const size_t bytes = static_cast<size_t>(count) * elem_size(type);
  std::vector<std::vector<std::byte>> all;
  RETURN_IF_ERROR(hub_.exchange(rank_, send, bytes, &all, op_timeout()));
  for (int r = 0; r < size(); r++)
    if (all[r].size() != bytes)
      return Status::InvalidArgument(fmt::format("rank {} reduced {} bytes, rank {} {}", r, all[r].size(), rank_, bytes));
  *acc = all[0];
  for (int r = 1; r < size(); r++) combine(acc->data(), all[r].data(), count, type, op);
  return Status::OK();
}

std::unique_ptr<Work> ThreadCommunicator::all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                                          ReduceOp op) {
  std::vector<std::byte> acc;
  Status st = reduce(send, count, type, op, &acc);
  if (st.ok() && !acc.empty()) std::memcpy(recv, acc.data(), acc.size());
  return done(st);
}

std::unique_ptr<Work> ThreadCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                                              ElemType type, ReduceOp op) {
  std::vector<std::byte> acc;
  Status st = reduce(send, recv_count * size(), type, op, &acc);
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(recv_count, 0)) * elem_size(type);
  if (st.ok() && bytes > 0) std::memcpy(recv, acc.data() + static_cast<size_t>(rank_) * bytes, bytes);
  return done(st);
}

std::unique_ptr<Work> ThreadCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count,
                                                          ElemType type) {
  if (send_count < 0) return done(Status::InvalidArgument("negative count"));
  const size_t bytes = static_cast<size_t>(send_count) * elem_size(type);
  std::vector<std::vector<std::byte>> all;
  Status st = hub_.exchange(rank_, send, bytes, &all, op_timeout());
  if (st.ok())
    for (int r = 0; r < size(); r++) {
      if (all[r].size() != bytes) return done(Status::InvalidArgument("all_gather: ranks sent different counts"));
      if (bytes > 0) std::memcpy(static_cast<std::byte*>(recv) + r * bytes, all[r].data(), bytes);
    }
  return done(st);
}

std::unique_ptr<Work> ThreadCommunicator::broadcast_async(void* data, int64_t count, ElemType type, int root) {
  if (count < 0 || root < 0 || root >= size())
    return done(Status::InvalidArgument(fmt::format("broadcast of {} elements from root {}", count, root)));
  const size_t bytes = static_cast<size_t>(count) * elem_size(type);
  std::vector<std::vector<std::byte>> all;
  Status st = hub_.exchange(rank_, data, rank_ == root ? bytes : 0, &all, op_timeout());
  if (st.ok() && all[root].size() != bytes)
    st = Status::InvalidArgument(fmt::format("broadcast: root sent {} bytes, rank {} expects {}", all[root].size(),
                                             rank_, bytes));
  if (st.ok() && rank_ != root && bytes > 0) std::memcpy(data, all[root].data(), bytes);
  return done(st);
}

std::unique_ptr<Work> ThreadCommunicator::send_async(const void* data, int64_t bytes, int peer, int tag) {
  if (bytes < 0 || peer < 0 || peer >= size())
    return done(Status::InvalidArgument(fmt::format("send of {} bytes to peer {}", bytes, peer)));
  hub_.post(rank_, peer, tag, data, static_cast<size_t>(bytes));
  return done(Status::OK());
}

std::unique_ptr<Work> ThreadCommunicator::recv_async(void* data, int64_t bytes, int peer, int tag) {
  if (bytes < 0 || peer < 0 || peer >= size())
    return done(Status::InvalidArgument(fmt::format("recv of {} bytes from peer {}", bytes, peer)));
  return done(hub_.take(peer, rank_, tag, data, static_cast<size_t>(bytes), op_timeout()));
}

std::unique_ptr<Work> ThreadCommunicator::barrier_async() { return done(hub_.barrier(op_timeout())); }

Result<std::unique_ptr<Communicator>> ThreadCommunicator::split(int, int, const std::string& name) {
  return Status::InvalidArgument(fmt::format("split into '{}': a thread communicator cannot split", name));
}

void run_ranks(int n, const std::function<void(Communicator&)>& fn) {
  ThreadHub hub(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++)
    threads.emplace_back([&hub, &fn, r] {
      ThreadCommunicator comm(hub, r);
      fn(comm);
    });
  for (std::thread& t : threads) t.join();
}

}  // namespace tessera::comm

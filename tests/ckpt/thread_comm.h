// N ranks as threads of one process (Gloo's test style): run_ranks(n, fn)
// calls fn(comm) on n threads, each with its own Communicator over a shared
// in-memory hub. Every operation completes inside the call (send is
// buffered), which is all the checkpoint protocol needs. A rank left alone
// at a collective gets Unavailable after 20 s instead of hanging the test.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "comm/communicator.h"

namespace tessera::testing_util {

class ThreadHub {
 public:
  explicit ThreadHub(int n) : n_(n), slots_(n) {}
  int size() const { return n_; }

  Status barrier() {
    std::unique_lock lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      generation_++;
      cv_.notify_all();
      return Status::OK();
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return generation_ != generation; }))
      return Status::Unavailable("thread hub: barrier timed out");
    return Status::OK();
  }
  // Every rank deposits bytes, then all see all deposits until the next barrier.
  Status exchange(int rank, const void* data, size_t bytes, std::vector<std::vector<std::byte>>* all) {
    {
      std::lock_guard lock(mu_);
      slots_[rank].assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + bytes);
    }
    if (Status st = barrier(); !st.ok()) return st;
    {
      std::lock_guard lock(mu_);
      *all = slots_;
    }
    return barrier();
  }
  void post(int from, int to, int tag, const void* data, size_t bytes) {
    std::lock_guard lock(mu_);
    auto* p = static_cast<const std::byte*>(data);
    mail_[{from, to, tag}].emplace_back(p, p + bytes);
    cv_.notify_all();
  }
  Status take(int from, int to, int tag, void* data, size_t bytes) {
    std::unique_lock lock(mu_);
    auto& box = mail_[{from, to, tag}];
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return !box.empty(); }))
      return Status::Unavailable("thread hub: recv timed out");
    if (box.front().size() != bytes) return Status::InvalidArgument("thread hub: message size mismatch");
    std::memcpy(data, box.front().data(), bytes);
    box.pop_front();
    return Status::OK();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<std::vector<std::byte>> slots_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> mail_;
};

class DoneWork : public comm::Work {
 public:
  explicit DoneWork(Status st) : st_(std::move(st)) {}
  bool test() override { return true; }
  Status wait() override { return st_; }

 private:
  Status st_;
};

class ThreadComm : public comm::Communicator {
 public:
  ThreadComm(ThreadHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_.size(); }
  const std::string& name() const override { return name_; }
  int world_rank_of(int rank) const override { return rank; }

  std::unique_ptr<comm::Work> all_reduce_async(const void* send, void* recv, int64_t count, comm::ElemType type,
                                               comm::ReduceOp op) override {
    const size_t bytes = count * comm::elem_size(type);
    std::vector<std::vector<std::byte>> all;
    Status st = hub_.exchange(rank_, send, bytes, &all);
    if (st.ok()) {
      std::vector<std::byte> acc = all[0];
      for (int r = 1; r < size(); r++) combine(acc.data(), all[r].data(), count, type, op);
      std::memcpy(recv, acc.data(), bytes);
    }
    return std::make_unique<DoneWork>(st);
  }
  std::unique_ptr<comm::Work> all_gather_async(const void* send, void* recv, int64_t send_count,
                                               comm::ElemType type) override {
    const size_t bytes = send_count * comm::elem_size(type);
    std::vector<std::vector<std::byte>> all;
    Status st = hub_.exchange(rank_, send, bytes, &all);
    if (st.ok())
      for (int r = 0; r < size(); r++) std::memcpy(static_cast<std::byte*>(recv) + r * bytes, all[r].data(), bytes);
    return std::make_unique<DoneWork>(st);
  }
  std::unique_ptr<comm::Work> broadcast_async(void* data, int64_t count, comm::ElemType type, int root) override {
    const size_t bytes = count * comm::elem_size(type);
    std::vector<std::vector<std::byte>> all;
    Status st = hub_.exchange(rank_, data, rank_ == root ? bytes : 0, &all);
    if (st.ok()) std::memcpy(data, all[root].data(), bytes);
    return std::make_unique<DoneWork>(st);
  }
  std::unique_ptr<comm::Work> send_async(const void* data, int64_t bytes, int peer, int tag) override {
    hub_.post(rank_, peer, tag, data, bytes);
    return std::make_unique<DoneWork>(Status::OK());
  }
  std::unique_ptr<comm::Work> recv_async(void* data, int64_t bytes, int peer, int tag) override {
    return std::make_unique<DoneWork>(hub_.take(peer, rank_, tag, data, bytes));
  }
  std::unique_ptr<comm::Work> barrier_async() override { return std::make_unique<DoneWork>(hub_.barrier()); }
  std::unique_ptr<comm::Work> reduce_scatter_async(const void*, void*, int64_t, comm::ElemType,
                                                   comm::ReduceOp) override {
    return std::make_unique<DoneWork>(Status::Internal("thread hub: reduce_scatter not supported"));
  }
  Result<std::unique_ptr<comm::Communicator>> split(int, int, const std::string&) override {
    return Status::Internal("thread hub: split not supported");
  }

 private:
  template <typename T>
  static void combine_as(std::byte* acc, const std::byte* in, int64_t count, comm::ReduceOp op) {
    for (int64_t i = 0; i < count; i++) {
      T a, b;
      std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
      std::memcpy(&b, in + i * sizeof(T), sizeof(T));
      a = op == comm::ReduceOp::kSum ? a + b : op == comm::ReduceOp::kMax ? std::max(a, b) : std::min(a, b);
      std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
    }
  }
  static void combine(std::byte* acc, const std::byte* in, int64_t count, comm::ElemType type, comm::ReduceOp op) {
    switch (type) {
      case comm::ElemType::kF32: return combine_as<float>(acc, in, count, op);
      case comm::ElemType::kF64: return combine_as<double>(acc, in, count, op);
      case comm::ElemType::kI32: return combine_as<int32_t>(acc, in, count, op);
      case comm::ElemType::kI64: return combine_as<int64_t>(acc, in, count, op);
      case comm::ElemType::kU64: return combine_as<uint64_t>(acc, in, count, op);
      case comm::ElemType::kU8: return combine_as<uint8_t>(acc, in, count, op);
    }
  }

  ThreadHub& hub_;
  const int rank_;
  const std::string name_ = "threads";
};

// Runs fn(comm) on n threads, rank r on thread r, and joins them.
inline void run_ranks(int n, const std::function<void(comm::Communicator&)>& fn) {
  ThreadHub hub(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++)
    threads.emplace_back([&hub, &fn, r] {
      ThreadComm comm(hub, r);
      fn(comm);
    });
  for (std::thread& t : threads) t.join();
}

}  // namespace tessera::testing_util

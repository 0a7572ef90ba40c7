// N ranks as threads of one process, over a shared in-memory hub (Gloo's
// test style): what tests of collective protocols (checkpoints, agree(),
// gradient reduction) run on without mpirun.
//
//   comm::run_ranks(4, [](comm::Communicator& c) { ... c.rank() ... });
//
// run_ranks(n, fn) calls fn on n threads, rank r on thread r, each with its
// own ThreadCommunicator over one ThreadHub, and joins them. Every operation
// completes inside the call (sends are buffered), so a Work is always done.
// A rank left alone at a collective or a recv gets Unavailable after the
// hub's timeout instead of hanging. split() and all_to_all_v use the
// defaults' limits: split is not supported (InvalidArgument).
// Thread safety: the hub is shared by its ranks' threads; each
// ThreadCommunicator is used by its own thread only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.h"

namespace tessera::comm {

class ThreadHub {
 public:
  explicit ThreadHub(int n, std::chrono::milliseconds timeout = std::chrono::seconds(20));
  int size() const { return n_; }
  // The deadline of a wait when the caller gives none.
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Each wait ends after `timeout` (the hub's when 0) with Unavailable.
  Status barrier(std::chrono::milliseconds timeout = {});
  // Every rank deposits bytes; all then see all deposits (until the next
  // exchange, which starts with a barrier).
  Status exchange(int rank, const void* data, size_t bytes, std::vector<std::vector<std::byte>>* all,
                  std::chrono::milliseconds timeout = {});
  void post(int from, int to, int tag, const void* data, size_t bytes);
  Status take(int from, int to, int tag, void* data, size_t bytes, std::chrono::milliseconds timeout = {});

 private:
  const int n_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<std::vector<std::byte>> slots_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> mail_;
};

class ThreadCommunicator final : public Communicator {
 public:
  // The hub must outlive the communicator.
  ThreadCommunicator(ThreadHub& hub, int rank, std::string name = "threads");
  int rank() const override { return rank_; }
  int size() const override { return hub_.size(); }
  const std::string& name() const override { return name_; }
  int world_rank_of(int rank) const override { return rank; }
  std::chrono::milliseconds timeout() const override { return hub_.timeout(); }

  std::unique_ptr<Work> all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                         ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, ElemType type,
                                             ReduceOp op) override;
  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, int64_t send_count, ElemType type) override;
  std::unique_ptr<Work> broadcast_async(void* data, int64_t count, ElemType type, int root) override;
  std::unique_ptr<Work> send_async(const void* data, int64_t bytes, int peer, int tag) override;
  std::unique_ptr<Work> recv_async(void* data, int64_t bytes, int peer, int tag) override;
  std::unique_ptr<Work> barrier_async() override;
  Result<std::unique_ptr<Communicator>> split(int color, int key, const std::string& name) override;

 private:
  Status reduce(const void* send, int64_t count, ElemType type, ReduceOp op, std::vector<std::byte>* acc);

  ThreadHub& hub_;
  const int rank_;
  const std::string name_;
};

// Runs fn(comm) on n threads, rank r on thread r, and joins them.
void run_ranks(int n, const std::function<void(Communicator&)>& fn);

}  // namespace tessera::comm

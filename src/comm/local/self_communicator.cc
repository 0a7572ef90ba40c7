#include "comm/local/self_communicator.h"
#include "comm/done_work.h"

#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace tessera::comm {
namespace {

// A recv to self posted before its send: completed by that send.
struct SelfRecv {
  int tag = 0;
  void* data = nullptr;
  int64_t bytes = 0;
  bool matched = false;
  Status status;
  std::string what;  // "recv #3 (16 bytes)"
};

class SelfRecvWork final : public Work {
 public:
  explicit SelfRecvWork(std::shared_ptr<SelfRecv> r) : r_(std::move(r)) {}
  bool test() override { return r_->matched; }
  Status wait() override {
    if (!r_->matched)
      return Status::Unavailable(fmt::format("{} on communicator 'self': no matching send was posted, and a "
                                             "single-process communicator has no other rank to send it",
                                             r_->what));
    return r_->status;
  }

 private:
  std::shared_ptr<SelfRecv> r_;
};

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int rank) const override { return rank; }
  // Its operations complete when issued; nothing waits.
  std::chrono::milliseconds timeout() const override { return CommOptions{}.timeout; }

  std::unique_ptr<Work> all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                         ReduceOp) override {
    return copy(send, recv, count, type);
  }
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, ElemType type,
                                             ReduceOp) override {
    return copy(send, recv, recv_count, type);
  }
  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, int64_t send_count, ElemType type) override {
    return copy(send, recv, send_count, type);
  }
  std::unique_ptr<Work> broadcast_async(void*, int64_t count, ElemType, int root) override {
    seq_++;
    if (root != 0 || count < 0) return error(fmt::format("broadcast of {} elements from root {}", count, root));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> send_async(const void* data, int64_t bytes, int peer, int tag) override {
    seq_++;
    if (peer != 0 || bytes < 0) return error(fmt::format("send of {} bytes to peer {}", bytes, peer));
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
      if ((*it)->tag != tag) continue;
      std::shared_ptr<SelfRecv> r = *it;
      recvs_.erase(it);
      deliver(*r, data, bytes);
      return std::make_unique<DoneWork>();
    }
    const char* p = static_cast<const char*>(data);
    sends_.push_back({tag, std::vector<char>(p, p + bytes)});
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> recv_async(void* data, int64_t bytes, int peer, int tag) override {
    seq_++;
    if (peer != 0 || bytes < 0) return error(fmt::format("recv of {} bytes from peer {}", bytes, peer));
    auto r = std::make_shared<SelfRecv>();
    r->tag = tag;
    r->data = data;
    r->bytes = bytes;
    r->what = fmt::format("recv #{} ({} bytes)", seq_, bytes);
    for (auto it = sends_.begin(); it != sends_.end(); ++it) {
      if (it->tag != tag) continue;
      deliver(*r, it->data.data(), static_cast<int64_t>(it->data.size()));
      sends_.erase(it);
      return std::make_unique<SelfRecvWork>(r);
    }
    recvs_.push_back(r);
    return std::make_unique<SelfRecvWork>(r);
  }
  std::unique_ptr<Work> barrier_async() override {
    seq_++;
    return std::make_unique<DoneWork>();
  }
  Result<std::unique_ptr<Communicator>> split(int color, int, const std::string& name) override {
    if (color < 0) return Status::InvalidArgument(fmt::format("split into '{}': color {} < 0", name, color));
    return std::unique_ptr<Communicator>(new SelfCommunicator(name));
  }

 private:
  struct PendingSend {
    int tag;
    std::vector<char> data;
  };

  std::unique_ptr<Work> copy(const void* src, void* dst, int64_t count, ElemType type) {
    seq_++;
    if (count < 0) return error("negative count");
    if (src != dst && count > 0) std::memmove(dst, src, count * elem_size(type));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> error(const std::string& why) {
    return std::make_unique<DoneWork>(
        Status::InvalidArgument(fmt::format("operation #{} on communicator '{}' (size 1): {}", seq_, name_, why)));
  }
  static void deliver(SelfRecv& r, const void* data, int64_t bytes) {
    r.matched = true;
    if (bytes > r.bytes) {
      r.status = Status::InvalidArgument(
          fmt::format("{} on communicator 'self': message of {} bytes truncated", r.what, bytes));
      return;
    }
    if (bytes > 0) std::memcpy(r.data, data, bytes);
  }

  std::string name_;
  uint64_t seq_ = 0;
  std::deque<PendingSend> sends_;               // sends to self not yet received, in posting order
  std::deque<std::shared_ptr<SelfRecv>> recvs_;  // recvs from self not yet matched, in posting order
};

}  // namespace

std::unique_ptr<Communicator> self_communicator(const std::string& name) {
  return std::make_unique<SelfCommunicator>(name);
}

}  // namespace tessera::comm

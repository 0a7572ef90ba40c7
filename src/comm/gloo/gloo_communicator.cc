#include "comm/gloo/gloo_communicator.h"
#include "comm/done_work.h"
#include "comm/gloo/tcp_device.h"

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>

namespace tessera::comm {

namespace {

// Gloo's Store over the rendezvous store (embedded or Redis), keys under a
// prefix. Gloo expects exceptions; its get() waits for the key.
class PrefixedStore : public gloo::rendezvous::Store {
 public:
  PrefixedStore(comm::Store& c, std::string prefix, std::chrono::milliseconds timeout)
      : c_(c), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    check(c_.set(prefix_ + key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    check(c_.wait({prefix_ + key}, timeout_));
    Result<std::string> v = c_.get(prefix_ + key);
    check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    check(c_.wait(full, timeout));
  }

 private:
  static void check(const Status& s) {
    if (!s.ok()) throw gloo::IoException(s.message());
  }
  comm::Store& c_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduce_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return static_cast<ReduceFn>(&gloo::max<T>);
    case ReduceOp::kMin:
      return static_cast<ReduceFn>(&gloo::min<T>);
    default:
      return static_cast<ReduceFn>(&gloo::sum<T>);
  }
}

ReduceFn reduce_fn(ElemType t, ReduceOp op) {
  switch (t) {
    case ElemType::kF32: return reduce_fn<float>(op);
    case ElemType::kF64: return reduce_fn<double>(op);
    case ElemType::kI32: return reduce_fn<int32_t>(op);
    case ElemType::kI64: return reduce_fn<int64_t>(op);
    case ElemType::kU64: return reduce_fn<uint64_t>(op);
    case ElemType::kU8: return reduce_fn<uint8_t>(op);
  }
  return nullptr;
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> ctx, std::string name, const CommOptions& o,
                   std::vector<std::string> names)
      : ctx_(std::move(ctx)),
        name_(std::move(name)),
        opts_(o),
        rank_(ctx_->rank),
        size_(ctx_->size),
        names_(std::move(names)) {
    if (names_.size() != static_cast<size_t>(size_)) names_.clear();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int rank) const override { return rank; }
  std::chrono::milliseconds timeout() const override { return opts_.timeout; }

  std::unique_ptr<Work> all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                         ReduceOp op) override {
    return run("all_reduce", count, type, [&] {
      if (send != recv) std::memcpy(recv, send, static_cast<size_t>(count) * elem_size(type));
      if (size_ == 1 || count == 0) return;
      gloo::AllreduceOptions o(ctx_);
      switch (type) {
        case ElemType::kF32: o.setOutput(static_cast<float*>(recv), static_cast<size_t>(count)); break;
        case ElemType::kF64: o.setOutput(static_cast<double*>(recv), static_cast<size_t>(count)); break;
        case ElemType::kI32: o.setOutput(static_cast<int32_t*>(recv), static_cast<size_t>(count)); break;
        case ElemType::kI64: o.setOutput(static_cast<int64_t*>(recv), static_cast<size_t>(count)); break;
        case ElemType::kU64: o.setOutput(static_cast<uint64_t*>(recv), static_cast<size_t>(count)); break;
        case ElemType::kU8: o.setOutput(static_cast<uint8_t*>(recv), static_cast<size_t>(count)); break;
      }
      o.setReduceFunction(reduce_fn(type, op));
      setup(o);
      gloo::allreduce(o);
    });
  }

  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, ElemType type,
                                             ReduceOp op) override {
    // An all-reduce of the whole buffer, then this rank's block (not
    // bandwidth-optimal; elastic training uses plain data parallelism).
    const size_t es = elem_size(type);
    std::vector<char> all(static_cast<size_t>(recv_count * size_) * es);
    std::memcpy(all.data(), send, all.size());
    Status s = all_reduce_async(all.data(), all.data(), recv_count * size_, type, op)->wait();
    if (s.ok()) std::memcpy(recv, all.data() + static_cast<size_t>(rank_ * recv_count) * es, recv_count * es);
    return std::make_unique<DoneWork>(s);
  }

  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, int64_t send_count, ElemType type) override {
    return run("all_gather", send_count, type, [&] {
      const size_t bytes = static_cast<size_t>(send_count) * elem_size(type);
      std::vector<char> mine(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
      if (size_ == 1) {
        std::memcpy(recv, mine.data(), bytes);
        return;
      }
      gloo::AllgatherOptions o(ctx_);
      o.setInput(reinterpret_cast<uint8_t*>(mine.data()), bytes);
      o.setOutput(static_cast<uint8_t*>(recv), bytes * size_);
      setup(o);
      gloo::allgather(o);
    });
  }

  std::unique_ptr<Work> broadcast_async(void* data, int64_t count, ElemType type, int root) override {
    return run("broadcast", count, type, [&] {
      if (size_ == 1 || count == 0) return;
      gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<uint8_t*>(data), static_cast<size_t>(count) * elem_size(type));
      o.setRoot(root);
      setup(o);
      gloo::broadcast(o);
    });
  }

  // Point-to-point: posted now, waited on in Work::wait() (Gloo matches a
  // send with the peer's recv of the same slot, so both sides must post
  // before either waits).
  std::unique_ptr<Work> send_async(const void* data, int64_t bytes, int peer, int tag) override {
    return p2p(true, const_cast<void*>(data), bytes, peer, tag);
  }

  std::unique_ptr<Work> recv_async(void* data, int64_t bytes, int peer, int tag) override {
    return p2p(false, data, bytes, peer, tag);
  }

  // gloo::alltoallv, which takes each buffer packed (block p right after
  // block p-1): blocks at other displacements go through packed copies.
  std::unique_ptr<Work> all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                           const std::vector<int64_t>& send_displs, void* recv,
                                           const std::vector<int64_t>& recv_counts,
                                           const std::vector<int64_t>& recv_displs, ElemType type) override {
    Status args =
        check_all_to_all_v_args(size_, rank_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    if (!args.ok())  // before Gloo sees them: its own checks would break the communicator
      return std::make_unique<DoneWork>(args.With(fmt::format("gloo {}: all_to_all_v #{}", name_, ++seq_)));
    const int64_t es = static_cast<int64_t>(elem_size(type));
    int64_t total = 0;
    for (int p = 0; p < size_; p++) total += send_counts[p];
    return run("all_to_all_v", total, type, [&] {
      std::vector<int64_t> send_bytes(size_), recv_bytes(size_);
      for (int p = 0; p < size_; p++) send_bytes[p] = send_counts[p] * es, recv_bytes[p] = recv_counts[p] * es;
      std::vector<char> send_packed, recv_packed;
      const char* in = pack(static_cast<const char*>(send), send_counts, send_displs, es, &send_packed);
      char* out = recv != nullptr && is_packed(recv_counts, recv_displs)
                      ? static_cast<char*>(recv) + recv_displs[0] * es
                      : nullptr;
      if (out == nullptr) {
        recv_packed.resize(static_cast<size_t>(std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0})));
        out = recv_packed.data();
      }
      char dummy[1];  // Gloo's buffers need an address even when empty
      gloo::AlltoallvOptions o(ctx_);
      o.setInput(reinterpret_cast<uint8_t*>(const_cast<char*>(in != nullptr ? in : dummy)), send_bytes);
      o.setOutput(reinterpret_cast<uint8_t*>(out != nullptr ? out : dummy), recv_bytes);
      setup(o);
      gloo::alltoallv(o);
      if (!recv_packed.empty()) {
        int64_t off = 0;
        for (int p = 0; p < size_; p++) {
          std::memcpy(static_cast<char*>(recv) + recv_displs[p] * es, recv_packed.data() + off,
                      static_cast<size_t>(recv_bytes[p]));
          off += recv_bytes[p];
        }
      }
    });
  }

  std::unique_ptr<Work> barrier_async() override {
    return run("barrier", 0, ElemType::kU8, [&] {
      if (size_ == 1) return;
      gloo::BarrierOptions o(ctx_);
      setup(o);
      gloo::barrier(o);
    });
  }

  Result<std::unique_ptr<Communicator>> split(int color, int key, const std::string& name) override {
    return Status::InvalidArgument("the Gloo communicator does not split (elastic training is data-parallel only)");
  }

 private:
  template <typename Options>
  void setup(Options& o) {
    o.setTag(static_cast<uint32_t>(seq_));
    o.setTimeout(op_timeout());
  }

  // Runs one operation; the first failure breaks the communicator (see the
  // header).
  std::unique_ptr<Work> run(const char* what, int64_t count, ElemType type, const std::function<void()>& op) {
    const int64_t seq = ++seq_;
    return std::make_unique<DoneWork>(guard(what, seq, count, type, op_timeout(), op));
  }
  // `timeout`: the operation's deadline, for the message.
  Status guard(const char* what, int64_t seq, int64_t count, ElemType type, std::chrono::milliseconds timeout,
               const std::function<void()>& op) {
    if (!broken_.ok())
      return Status::Unavailable(fmt::format("gloo {}: {} #{} not run: the communicator broke earlier: {}", name_,
                                             what, seq, broken_.message()));
    try {
      op();
      return Status::OK();
    } catch (const std::exception& e) {
      broken_ = Status::Unavailable(fmt::format("gloo {}: {} #{} ({} x {}) failed on {} of {} ({}, deadline {:.1f} s): "
                                                "{}{}",
                                                name_, what, seq, elem_name(type), count, who(rank_), size_,
                                                peer_list(), timeout.count() / 1e3, e.what(),
                                                waited_on(what, e.what())));
      // Closing every connection now wakes the peers waiting on this rank.
      ctx_.reset();
      return broken_;
    }
  }

  class P2PWork : public Work {
   public:
    P2PWork(GlooCommunicator* c, std::string what, int64_t seq, int64_t bytes, bool send,
            std::chrono::milliseconds timeout, std::unique_ptr<gloo::transport::UnboundBuffer> buf)
        : c_(c), what_(std::move(what)), seq_(seq), bytes_(bytes), send_(send), timeout_(timeout),
          buf_(std::move(buf)) {}
    bool test() override { return done_; }
    Status wait() override {
      if (done_) return status_;
      done_ = true;
      status_ = c_->guard(what_.c_str(), seq_, bytes_, ElemType::kU8, timeout_, [&] {
        const bool ok = send_ ? buf_->waitSend(timeout_) : buf_->waitRecv(timeout_);
        if (!ok) throw gloo::IoException("aborted");
      });
      buf_.reset();
      return status_;
    }

   private:
    GlooCommunicator* c_;
    std::string what_;
    int64_t seq_, bytes_;
    bool send_, done_ = false;
    std::chrono::milliseconds timeout_;  // the deadline it was issued with
    Status status_;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  };

  std::unique_ptr<Work> p2p(bool send, void* data, int64_t bytes, int peer, int tag) {
    const int64_t seq = ++seq_;
    const std::string what = fmt::format("{} {} (tag {})", send ? "send to" : "recv from", peer, tag);
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    const std::chrono::milliseconds timeout = op_timeout();
    Status s = guard(what.c_str(), seq, bytes, ElemType::kU8, timeout, [&] {
      buf = ctx_->createUnboundBuffer(data, static_cast<size_t>(bytes));
      if (send) buf->send(peer, static_cast<uint64_t>(tag));
      else buf->recv(peer, static_cast<uint64_t>(tag));
    });
    if (!s.ok()) return std::make_unique<DoneWork>(s);
    return std::make_unique<P2PWork>(this, what, seq, bytes, send, timeout, std::move(buf));
  }

  static bool is_packed(const std::vector<int64_t>& counts, const std::vector<int64_t>& displs) {
    for (size_t p = 1; p < counts.size(); p++)
      if (displs[p] != displs[p - 1] + counts[p - 1]) return false;
    return true;
  }
  // The blocks of `base` back to back: base itself (at its first block)
  // when already so, else a copy in *packed.
  static const char* pack(const char* base, const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                          int64_t es, std::vector<char>* packed) {
    if (is_packed(counts, displs)) return base == nullptr ? nullptr : base + displs[0] * es;
    int64_t off = 0;
    packed->resize(static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0}) * es));
    for (size_t p = 0; p < counts.size(); p++) {
      std::memcpy(packed->data() + off, base + displs[p] * es, static_cast<size_t>(counts[p] * es));
      off += counts[p] * es;
    }
    return packed->data();
  }

  // "rank 2 (host:pid)", or "rank 2" without names.
  std::string who(int r) const {
    return names_.empty() ? fmt::format("rank {}", r) : fmt::format("rank {} ({})", r, names_[r]);
  }
  // "peers 1-3", with their names in a small round: "peers 1 (h:12), 2 (h:13)".
  std::string peer_list() const {
    std::vector<int> peers(size_);
    std::iota(peers.begin(), peers.end(), 0);
    peers.erase(peers.begin() + rank_);
    if (names_.empty() || size_ > 8) return "peers " + format_peer_list(peers);
    std::string s;
    for (int p : peers) s += fmt::format("{}{} ({})", s.empty() ? "peers " : ", ", p, names_[p]);
    return s;
  }
  // For a deadline (Gloo's "Timed out waiting Nms for recv operation to
  // complete" names no peer): the rank this one was waiting on, where the
  // operation tells. Gloo's ring all_reduce receives from rank + 1 and sends
  // to rank - 1, its all_gather receives from rank - 1 and sends to rank + 1
  // (gloo/allreduce.cc, gloo/allgather.cc); a point-to-point operation waits
  // on its peer. In a ring every rank ends up waiting, on its neighbour: the
  // first to time out is the silent rank's neighbour, and its error names
  // the silent rank. Empty for other operations and other errors.
  std::string waited_on(const std::string& what, const std::string& error) const {
    if (error.find("Timed out") == std::string::npos || size_ < 2) return "";
    const bool recv = error.find("recv operation") != std::string::npos;
    const bool send = error.find("send operation") != std::string::npos;
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    int peer = -1;
    std::string how;
    if (what == "all_reduce" && (recv || send)) {
      peer = recv ? next : prev;
      how = recv ? "the rank it receives from in the ring" : "the rank it sends to in the ring";
    } else if (what == "all_gather" && (recv || send)) {
      peer = recv ? prev : next;
      how = recv ? "the rank it receives from in the ring" : "the rank it sends to in the ring";
    } else if (what.rfind("recv from ", 0) == 0 || what.rfind("send to ", 0) == 0) {
      peer = std::atoi(what.c_str() + what.find(' ', 5) + 1);
      how = "its peer";
    }
    if (peer < 0 || peer >= size_ || peer == rank_) return "";
    return fmt::format("; this rank waited on {}, {}", who(peer), how);
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::string name_;
  CommOptions opts_;
  int rank_, size_;
  std::vector<std::string> names_;  // by rank, or empty
  int64_t seq_ = 0;
  Status broken_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_gloo_communicator(Store& store, const std::string& prefix,
                                                             int rank, int size, const std::string& host,
                                                             const CommOptions& options, const std::string& name,
                                                             const GlooConnect& connect) {
  if (size < 1 || rank < 0 || rank >= size)
    return Status::InvalidArgument(fmt::format("gloo: rank {} of size {}", rank, size));
  // Gloo's transport threads write to peers with plain writev: a peer that
  // left (what elastic training exists for) would raise SIGPIPE in one of
  // them and end the process. Ignored process-wide, once, so the write fails
  // with EPIPE and the collective reports it (GlooCommunicator.PeerGone...
  // died of SIGPIPE under load in CI otherwise).
  static std::once_flag sigpipe_ignored;
  std::call_once(sigpipe_ignored, [] { ::signal(SIGPIPE, SIG_IGN); });
  const std::chrono::milliseconds connect_timeout =
      connect.timeout.count() > 0 ? connect.timeout : options.timeout;
  try {
    auto dev = make_tcp_device(host);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(connect_timeout);
    PrefixedStore s(store, prefix, connect_timeout);
    ctx->connectFullMesh(s, dev);
    // From here on, the collectives' deadline (each operation also sets
    // its own, in setup()).
    ctx->setTimeout(options.timeout);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(ctx), name, options, connect.names));
  } catch (const std::exception& e) {
    return Status::Unavailable(fmt::format("gloo {}: rank {} of {} could not connect to its peers within {:.1f} s "
                                           "(store {}, keys {}): {}",
                                           name, rank, size, connect_timeout.count() / 1e3, store.address(), prefix,
                                           e.what()));
  }
}

}  // namespace tessera::comm

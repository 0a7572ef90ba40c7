// MPI communicator (nonblocking MPI calls + deadline-bounded waits), the
// single-process "self" communicator, and MPI start-up/shut-down.
#include "comm/mpi/mpi_communicator.h"
#include "comm/op_wait.h"
#include "comm/local/self_communicator.h"

#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/traffic.h"
#include "core/check.h"
#include "core/host.h"

namespace tessera::comm {

namespace {

using Clock = std::chrono::steady_clock;

// MPI return code -> Status (the one macro family, core/try.h: TRY_MPI
// returns it). Every MPI call goes through TESSERA_MPI, which
// names the function (not its arguments) in the message.
Status mpi_status(int rc, const char* fn) {
  if (rc == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = std::snprintf(text, sizeof(text), "MPI error %d", rc);
  return Status::Internal(fmt::format("{}: {}", fn, std::string(text, len)));
}
#define TESSERA_MPI(fn, ...) mpi_status(fn(__VA_ARGS__), #fn)
#define TRY_MPI(fn, ...) RETURN_IF_ERROR(TESSERA_MPI(fn, __VA_ARGS__))

// Process-wide MPI bookkeeping. Only the thread that initialised MPI touches
// it (MPI_THREAD_FUNNELED).
struct MpiProcess {
  bool we_initialised = false;
  // Requests whose Work was destroyed before they completed (the caller gave
  // up, e.g. on a timeout). Collective requests can be neither cancelled nor
  // freed, so they are completed, or waited for, at finalisation.
  std::vector<MPI_Request> orphans;
  // What orphaned requests still read (see MpiWork::keep), freed with them.
  std::vector<std::shared_ptr<void>> orphan_keep;
  int64_t chunk_limit = int64_t{1} << 30;
  // Host of every world rank (TESSERA_HOST, set by the cluster harness's
  // launch agent, else the host name), for diagnostics; filled by mpi_world.
  std::vector<std::string> world_hosts;
  // A private duplicate of MPI_COMM_WORLD for health checks after a timeout.
  MPI_Comm health = MPI_COMM_NULL;
};
MpiProcess& mpi_process() {
  static MpiProcess p;
  return p;
}

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

Status ensure_mpi_initialised() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return Status::Unavailable("MPI was already finalised in this process");
  if (init) return Status::OK();
  MpiProcess& p = mpi_process();  // constructed before the finaliser below, so destroyed after it
  // OpenMPI's nonblocking all-reduce (libnbc) picks a binomial reduce +
  // broadcast for few ranks, which moves every byte twice over the slowest
  // link: 48% of a shaped 1 Gbit/s link's bus bandwidth on 2 hosts. The
  // reduce-scatter + all-gather algorithm reaches 93% there (docs/cluster.md).
  // An explicit setting in the environment still wins.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
  // OpenMPI's TCP transport writes to its peers with plain writev: a write
  // to a rank whose host is gone can raise SIGPIPE, and the rank then dies
  // of it without a word (cli.slurm_train's lost node once: srun's "task 0:
  // Broken pipe", before any rank's timeout named the host). Ignored, the
  // write fails with EPIPE and the transport reports the peer's host.
  ::signal(SIGPIPE, SIG_IGN);
  int provided = 0;
  TRY_MPI(MPI_Init_thread, nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  p.we_initialised = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  struct Finaliser {
    ~Finaliser() { mpi_finalize(); }
  };
  static Finaliser finaliser;
  return Status::OK();
}

MPI_Datatype mpi_type(ElemType t) {
  switch (t) {
    case ElemType::kF32: return MPI_FLOAT;
    case ElemType::kF64: return MPI_DOUBLE;
    case ElemType::kI32: return MPI_INT32_T;
    case ElemType::kI64: return MPI_INT64_T;
    case ElemType::kU64: return MPI_UINT64_T;
    case ElemType::kU8: return MPI_UINT8_T;
  }
  CHECK(false && "unknown ElemType");
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  CHECK(false && "unknown ReduceOp");
  return MPI_OP_NULL;
}

// " on host(s) h2, h3" for world ranks, when mpi_world learnt the hosts.
std::string format_peer_hosts(const std::vector<int>& peers) {
  const std::vector<std::string>& hosts = mpi_process().world_hosts;
  std::vector<std::string> names;
  for (int r : peers) {
    if (r < 0 || r >= static_cast<int>(hosts.size())) return "";
    if (std::find(names.begin(), names.end(), hosts[r]) == names.end()) names.push_back(hosts[r]);
  }
  if (names.empty()) return "";
  std::string out = names.size() == 1 ? " on host " : " on hosts ";
  for (size_t i = 0; i < names.size() && i < 16; i++) out += (i ? ", " : "") + names[i];
  return out;
}

// What a Work needs of its communicator for diagnostics; shared so a Work
// may outlive the Communicator object.
struct CommInfo {
  std::string name;
  int rank = 0;
  std::vector<int> world_ranks;  // (size) world rank of each member
  std::chrono::milliseconds timeout{0};
};

std::string describe_on(const OpDesc& d, const CommInfo& c) {
  return fmt::format("{} on communicator '{}' [world ranks {}]", d.describe(), c.name,
                     format_rank_runs(c.world_ranks));
}

// After a collective timed out, which peers are still alive? Every rank that
// timed out on the same operation sends a 1-byte "alive" to each peer on the
// health communicator and listens for theirs, for up to `window`. Peers not
// heard from are the ones that stalled, died or were cut off. Receives still
// pending are cancelled; sends are freed (they may never be delivered).
std::vector<int> unresponsive_peers(const std::vector<int>& peers, std::chrono::milliseconds window) {
  MPI_Comm health = mpi_process().health;
  if (health == MPI_COMM_NULL || peers.empty()) return {};
  constexpr int kHealthTag = 7177;
  static char alive_out = 1;
  std::vector<char> alive_in(peers.size());
  std::vector<MPI_Request> sends(peers.size(), MPI_REQUEST_NULL), recvs(peers.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < peers.size(); i++) {
    MPI_Irecv(&alive_in[i], 1, MPI_CHAR, peers[i], kHealthTag, health, &recvs[i]);
    MPI_Isend(&alive_out, 1, MPI_CHAR, peers[i], kHealthTag, health, &sends[i]);
  }
  std::vector<bool> heard(peers.size(), false);
  const auto deadline = Clock::now() + window;
  size_t count = 0;
  while (count < peers.size() && Clock::now() < deadline) {
    for (size_t i = 0; i < peers.size(); i++) {
      if (heard[i]) continue;
      int flag = 0;
      MPI_Test(&recvs[i], &flag, MPI_STATUS_IGNORE);
      if (flag) heard[i] = true, count++;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<int> silent;
  for (size_t i = 0; i < peers.size(); i++) {
    if (!heard[i]) {
      silent.push_back(peers[i]);
      MPI_Cancel(&recvs[i]);
      MPI_Wait(&recvs[i], MPI_STATUS_IGNORE);
    }
    if (sends[i] != MPI_REQUEST_NULL) MPI_Request_free(&sends[i]);
  }
  return silent;
}

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<const CommInfo> comm, const OpDesc& desc, int64_t bytes, std::chrono::milliseconds timeout)
      : comm_(std::move(comm)), desc_(desc), bytes_(bytes), timeout_(timeout) {}
  ~MpiWork() override {
    untrack();
    if (done_ || !mpi_active()) return;
    bool pending = false;
    for (MPI_Request& r : reqs_) {
      int flag = 0;
      if (r != MPI_REQUEST_NULL) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (r != MPI_REQUEST_NULL) mpi_process().orphans.push_back(r), pending = true;
    }
    // What MPI may still read lives as long as a request it serves.
    if (keep_ && pending) mpi_process().orphan_keep.push_back(std::move(keep_));
  }

  void add(MPI_Request r) { reqs_.push_back(r); }
  // Memory MPI still reads after posting, kept until the request completes
  // (or, orphaned, until finalisation): OpenMPI 4.1's nonblocking
  // alltoallw keeps the caller's datatype arrays, not a copy, and reads
  // them at completion to release the types it retained.
  void keep(std::shared_ptr<void> k) { keep_ = std::move(k); }
  // Counted in traffic() as in flight until seen complete (or abandoned).
  void track(OpKind k) { kind_ = static_cast<int>(k); }
  // Posting failed: wait() reports it (after whatever was posted is orphaned).
  void fail(const Status& st) {
    if (status_.ok()) status_ = st.With(describe_on(desc_, *comm_));
  }

  bool test() override {
    if (!poll()) return false;
    untrack();
    return true;
  }

  bool poll() {
    if (done_) return true;
    if (!status_.ok()) return true;
    if (reqs_.empty()) return done_ = true;
    statuses_.resize(reqs_.size());
    int flag = 0;
    int rc = MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, statuses_.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& s : statuses_)
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) rc = s.MPI_ERROR;
    }
    if (rc != MPI_SUCCESS) {
      fail(mpi_status(rc, "MPI_Testall"));
      return true;
    }
    return done_ = flag != 0;
  }

  Status wait() override {
    Poller poller(bytes_, kMpiSpinGBps);
    const auto deadline = poller.start() + timeout_;
    while (!test()) {
      const auto now = Clock::now();
      if (now >= deadline) return timed_out(now - poller.start());
      poller.pause(deadline);
    }
    return status_;
  }

 private:
  Status timed_out(Clock::duration waited) const {
    std::vector<int> peers;
    if (desc_.peer >= 0) {
      peers.push_back(comm_->world_ranks[desc_.peer]);
    } else {
      for (int r = 0; r < static_cast<int>(comm_->world_ranks.size()); r++)
        if (r != comm_->rank) peers.push_back(comm_->world_ranks[r]);
    }
    const int me = comm_->world_ranks[comm_->rank];
    const std::vector<std::string>& hosts = mpi_process().world_hosts;
    const std::string my_host = me < static_cast<int>(hosts.size()) ? " on " + hosts[me] : "";
    // A collective cannot say whom it waits for; ask the peers directly.
    std::string verdict;
    if (peers.size() > 1) {
      auto window = std::min(std::chrono::milliseconds(2000),
                             timeout_ / 2);
      std::vector<int> silent = unresponsive_peers(peers, window);
      if (!silent.empty())
        verdict = fmt::format("; no answer from peers {}{}", format_peer_list(silent), format_peer_hosts(silent));
    }
    return Status::Unavailable(fmt::format("{} timed out after {:.1f} s waiting on peers {}{} (rank {}{}){}",
                                           describe_on(desc_, *comm_),
                                           std::chrono::duration<double>(waited).count(), format_peer_list(peers),
                                           format_peer_hosts(peers), me, my_host, verdict));
  }

  void untrack() {
    if (kind_ < 0) return;
    traffic().op_finished(static_cast<OpKind>(kind_));
    kind_ = -1;
  }

  std::shared_ptr<const CommInfo> comm_;
  OpDesc desc_;
  int64_t bytes_;  // bytes this rank moves, for the spin budget
  std::chrono::milliseconds timeout_;  // the deadline it was issued with
  int kind_ = -1;  // the OpKind in flight in traffic(); -1: none
  std::vector<MPI_Request> reqs_;
  std::shared_ptr<void> keep_;
  std::vector<MPI_Status> statuses_;
  Status status_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm.
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<const CommInfo> info) : comm_(comm), info_(std::move(info)) {}
  ~MpiCommunicator() override {
    if (mpi_active()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return info_->rank; }
  int size() const override { return static_cast<int>(info_->world_ranks.size()); }
  const std::string& name() const override { return info_->name; }
  int world_rank_of(int rank) const override { return info_->world_ranks.at(rank); }
  std::chrono::milliseconds timeout() const override { return info_->timeout; }

  std::unique_ptr<Work> all_reduce_async(const void* send, void* recv, int64_t count, ElemType type,
                                         ReduceOp op) override {
    const size_t esz = elem_size(type);
    auto w = begin({"all_reduce", 0, count, type}, count * esz);
    if (count < 0) return invalid(std::move(w), "negative count");
    account(*w, OpKind::kAllReduce, count * static_cast<int64_t>(esz));
    const bool in_place = send == recv;
    for_each_chunk(*w, count, [&](int64_t off, int n, MPI_Request* req) {
      return TESSERA_MPI(MPI_Iallreduce, in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + off * esz,
                         static_cast<char*>(recv) + off * esz, n, mpi_type(type), mpi_op(op), comm_, req);
    });
    return w;
  }

  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, ElemType type,
                                             ReduceOp op) override {
    auto w = begin({"reduce_scatter", 0, recv_count, type}, recv_count * size() * elem_size(type));
    if (recv_count < 0) return invalid(std::move(w), "negative count");
    // Blocks are strided by recv_count, so chunks would not be contiguous;
    // and MPI's implementations index the whole send buffer with int.
    if (recv_count * size() > mpi_chunk_limit())
      return invalid(std::move(w), fmt::format("{} x {} elements exceed the {} elements one MPI reduce_scatter "
                                               "carries; reduce in smaller buckets",
                                               size(), recv_count, mpi_chunk_limit()));
    account(*w, OpKind::kReduceScatter, recv_count * size() * static_cast<int64_t>(elem_size(type)));
    MPI_Request req;
    Status st = TESSERA_MPI(MPI_Ireduce_scatter_block, send == recv ? MPI_IN_PLACE : send, recv,
                            static_cast<int>(recv_count), mpi_type(type), mpi_op(op), comm_, &req);
    if (st.ok()) w->add(req); else w->fail(st);
    return w;
  }

  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, int64_t send_count, ElemType type) override {
    const size_t esz = elem_size(type);
    auto w = begin({"all_gather", 0, send_count, type}, send_count * size() * esz);
    if (send_count < 0) return invalid(std::move(w), "negative count");
    const bool in_place = send == static_cast<char*>(recv) + rank() * send_count * esz;
    const MPI_Datatype dt = mpi_type(type);
    account(*w, OpKind::kAllGather, send_count * size() * static_cast<int64_t>(esz));
    if (send_count * size() <= mpi_chunk_limit()) {
      MPI_Request req;
      const int n = static_cast<int>(send_count);
      Status st = TESSERA_MPI(MPI_Iallgather, in_place ? MPI_IN_PLACE : send, n, dt, recv, n, dt, comm_, &req);
      if (st.ok()) w->add(req); else w->fail(st);
      return w;
    }
    // Chunk c of every block at once: one element of a type of n elements
    // whose extent is a whole block, so rank r's piece lands in block r.
    for_each_chunk(*w, send_count, [&](int64_t off, int n, MPI_Request* req) -> Status {
      MPI_Datatype piece, block;
      TRY_MPI(MPI_Type_contiguous, n, dt, &piece);
      Status st = TESSERA_MPI(MPI_Type_create_resized, piece, 0, static_cast<MPI_Aint>(send_count * esz), &block);
      MPI_Type_free(&piece);
      RETURN_IF_ERROR(st);
      st = TESSERA_MPI(MPI_Type_commit, &block);
      if (st.ok())
        st = TESSERA_MPI(MPI_Iallgather, in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + off * esz, n,
                         dt, static_cast<char*>(recv) + off * esz, 1, block, comm_, req);
      MPI_Type_free(&block);  // a pending operation keeps its own reference
      return st;
    });
    return w;
  }

  std::unique_ptr<Work> broadcast_async(void* data, int64_t count, ElemType type, int root) override {
    const size_t esz = elem_size(type);
    auto w = begin({"broadcast", 0, count, type}, count * esz);
    if (count < 0) return invalid(std::move(w), "negative count");
    if (root < 0 || root >= size()) return invalid(std::move(w), fmt::format("root {} out of range", root));
    account(*w, OpKind::kBroadcast, count * static_cast<int64_t>(esz), root);
    for_each_chunk(*w, count, [&](int64_t off, int n, MPI_Request* req) {
      return TESSERA_MPI(MPI_Ibcast, static_cast<char*>(data) + off * esz, n, mpi_type(type), root, comm_, req);
    });
    return w;
  }

  std::unique_ptr<Work> send_async(const void* data, int64_t bytes, int peer, int tag) override {
    auto w = begin({"send", 0, bytes, ElemType::kU8, true, peer}, bytes);
    if (Status st = check_p2p(bytes, peer, tag); !st.ok()) return invalid(std::move(w), st.message());
    account_p2p(*w, peer, bytes, 0);
    for_each_chunk(*w, bytes, [&](int64_t off, int n, MPI_Request* req) {
      return TESSERA_MPI(MPI_Isend, static_cast<const char*>(data) + off, n, MPI_BYTE, peer, tag, comm_, req);
    });
    return w;
  }

  std::unique_ptr<Work> recv_async(void* data, int64_t bytes, int peer, int tag) override {
    auto w = begin({"recv", 0, bytes, ElemType::kU8, true, peer}, bytes);
    if (Status st = check_p2p(bytes, peer, tag); !st.ok()) return invalid(std::move(w), st.message());
    account_p2p(*w, peer, 0, bytes);
    for_each_chunk(*w, bytes, [&](int64_t off, int n, MPI_Request* req) {
      return TESSERA_MPI(MPI_Irecv, static_cast<char*>(data) + off, n, MPI_BYTE, peer, tag, comm_, req);
    });
    return w;
  }

  // MPI_Ialltoallw, the form of MPI_Ialltoallv with a datatype and a byte
  // displacement per peer: a block whose count or displacement does not fit
  // one MPI call's int (mpi_chunk_limit()) is described by a derived type
  // (whole chunks plus a remainder, at its 64-bit byte offset) while the
  // others go as plain counts. Every rank thus calls the same collective
  // whatever its own sizes, which a per-rank choice between Ialltoallv and a
  // fallback could not guarantee.
  std::unique_ptr<Work> all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                           const std::vector<int64_t>& send_displs, void* recv,
                                           const std::vector<int64_t>& recv_counts,
                                           const std::vector<int64_t>& recv_displs, ElemType type) override {
    const int n = size();
    const size_t esz = elem_size(type);
    int64_t moved = 0;
    for (size_t p = 0; p < send_counts.size() && p < recv_counts.size(); p++)
      moved += std::max<int64_t>(send_counts[p], 0) + std::max<int64_t>(recv_counts[p], 0);
    auto w = begin({"all_to_all_v", 0, moved, type}, moved * static_cast<int64_t>(esz));
    if (Status st = check_all_to_all_v_args(n, info_->rank, send, send_counts, send_displs, recv, recv_counts, recv_displs);
        !st.ok())
      return invalid(std::move(w), st.message());
    traffic().account_all_to_all(info_->rank, info_->world_ranks, send_counts, recv_counts,
                                 static_cast<int64_t>(esz));
    w->track(OpKind::kAllToAll);
    struct Arrays {
      std::vector<int> sc, sd, rc, rd;
      std::vector<MPI_Datatype> stypes, rtypes;
    };
    auto arrays = std::make_shared<Arrays>();
    std::vector<int>&sc = arrays->sc, &sd = arrays->sd, &rc = arrays->rc, &rd = arrays->rd;
    std::vector<MPI_Datatype>&stypes = arrays->stypes, &rtypes = arrays->rtypes;
    for (auto* v : {&sc, &sd, &rc, &rd}) v->resize(n);
    stypes.resize(n), rtypes.resize(n);
    std::vector<MPI_Datatype> derived;  // freed once posted (a pending operation keeps its own reference)
    Status ok = Status::OK();
    for (int p = 0; p < n && ok.ok(); p++) {
      if (p == info_->rank) {  // this rank's own block: copied here, not by MPI (see below)
        sc[p] = sd[p] = rc[p] = rd[p] = 0;
        stypes[p] = rtypes[p] = mpi_type(type);
        continue;
      }
      ok = describe_block(type, send_counts[p], send_displs[p], &sc[p], &sd[p], &stypes[p], &derived);
      if (ok.ok()) ok = describe_block(type, recv_counts[p], recv_displs[p], &rc[p], &rd[p], &rtypes[p], &derived);
    }
    // This rank's own block is a plain copy here, so MPI never copies
    // locally through one of the derived types above.
    const int me = info_->rank;
    if (ok.ok() && send_counts[me] > 0)
      std::memmove(static_cast<char*>(recv) + recv_displs[me] * esz,
                   static_cast<const char*>(send) + send_displs[me] * esz, send_counts[me] * esz);
    if (ok.ok()) {
      MPI_Request req;
      // MPI forbids a null buffer argument only where a count is non-zero;
      // a rank with nothing to send may pass null.
      ok = TESSERA_MPI(MPI_Ialltoallw, send, sc.data(), sd.data(), stypes.data(), recv, rc.data(), rd.data(), rtypes.data(),
                       comm_, &req);
      if (ok.ok()) w->add(req), w->keep(arrays);
    }
    for (MPI_Datatype& t : derived) MPI_Type_free(&t);
    if (!ok.ok()) w->fail(ok);
    return w;
  }

  std::unique_ptr<Work> barrier_async() override {
    auto w = begin({"barrier"}, 0);
    MPI_Request req;
    Status st = TESSERA_MPI(MPI_Ibarrier, comm_, &req);
    if (st.ok()) w->add(req); else w->fail(st);
    return w;
  }

  Result<std::unique_ptr<Communicator>> split(int color, int key, const std::string& name) override {
    if (color < 0) return Status::InvalidArgument(fmt::format("split into '{}': color {} < 0", name, color));
    // Everyone's (color, key) first, under the deadline: a rank that never
    // arrives shows up as a timeout here instead of a hang in MPI_Comm_split,
    // and the list gives the new communicator's members.
    std::vector<int32_t> all(2 * size());
    const int32_t mine[2] = {color, key};
    RETURN_IF_ERROR(all_gather(mine, all.data(), 2, ElemType::kI32).With(fmt::format("split into '{}'", name)));
    std::vector<int> members;  // ranks in this communicator, in the new order
    for (int r = 0; r < size(); r++)
      if (all[2 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });

    MPI_Comm sub;
    TRY_MPI(MPI_Comm_split, comm_, color, key, &sub);
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    auto info = std::make_shared<CommInfo>();
    info->name = name;
    info->timeout = info_->timeout;
    MPI_Comm_rank(sub, &info->rank);
    for (int r : members) info->world_ranks.push_back(info_->world_ranks[r]);
    CHECK(static_cast<int>(members.size()) > info->rank && members[info->rank] == rank());
    return std::unique_ptr<Communicator>(new MpiCommunicator(sub, std::move(info)));
  }

 private:
  std::unique_ptr<MpiWork> begin(OpDesc desc, int64_t bytes) {
    desc.seq = ++seq_;
    return std::make_unique<MpiWork>(info_, desc, bytes, op_timeout());
  }

  // traffic(): a collective by its algorithm's model, a send or receive exactly.
  void account(MpiWork& w, OpKind k, int64_t bytes, int root = 0) {
    traffic().account_collective(k, bytes, info_->rank, info_->world_ranks, root);
    w.track(k);
  }
  void account_p2p(MpiWork& w, int peer, int64_t sent, int64_t received) {
    traffic().op_posted(OpKind::kSendRecv, static_cast<double>(sent + received));
    traffic().add_peer_bytes(info_->world_ranks[static_cast<size_t>(peer)], static_cast<uint64_t>(sent),
                             static_cast<uint64_t>(received));
    w.track(OpKind::kSendRecv);
  }

  std::unique_ptr<Work> invalid(std::unique_ptr<MpiWork> w, const std::string& why) {
    w->fail(Status::InvalidArgument(why));
    return w;
  }

  // One peer's block of an all-to-all as MPI_Ialltoallw's (count, byte
  // displacement, type): the element type itself when the count and the
  // displacement fit mpi_chunk_limit() (and the byte displacement an int),
  // else one element of a derived type: q chunks of the limit and a
  // remainder, at the block's 64-bit byte offset from the buffer.
  static Status describe_block(ElemType type, int64_t count, int64_t displ, int* mpi_count, int* mpi_displ,
                               MPI_Datatype* mpi_type_out, std::vector<MPI_Datatype>* derived) {
    const MPI_Datatype base = mpi_type(type);
    const int64_t esz = static_cast<int64_t>(elem_size(type));
    const int64_t limit = mpi_chunk_limit();
    *mpi_type_out = base;
    if (count == 0) {
      *mpi_count = 0, *mpi_displ = 0;
      return Status::OK();
    }
    if (count <= limit && displ <= limit && displ * esz <= INT_MAX) {
      *mpi_count = static_cast<int>(count), *mpi_displ = static_cast<int>(displ * esz);
      return Status::OK();
    }
    const int64_t chunks = count / limit, rest = count % limit;
    MPI_Datatype chunk = MPI_DATATYPE_NULL, tail = MPI_DATATYPE_NULL, block = MPI_DATATYPE_NULL;
    if (chunks > 0) TRY_MPI(MPI_Type_contiguous, static_cast<int>(limit), base, &chunk);
    if (rest > 0)
      if (Status st = TESSERA_MPI(MPI_Type_contiguous, static_cast<int>(rest), base, &tail); !st.ok()) {
        if (chunk != MPI_DATATYPE_NULL) MPI_Type_free(&chunk);
        return st;
      }
    int lens[2];
    MPI_Aint offs[2];
    MPI_Datatype types[2];
    int parts = 0;
    if (chunks > 0) lens[parts] = static_cast<int>(chunks), offs[parts] = displ * esz, types[parts++] = chunk;
    if (rest > 0) lens[parts] = 1, offs[parts] = (displ + chunks * limit) * esz, types[parts++] = tail;
    Status st = TESSERA_MPI(MPI_Type_create_struct, parts, lens, offs, types, &block);
    if (chunk != MPI_DATATYPE_NULL) MPI_Type_free(&chunk);
    if (tail != MPI_DATATYPE_NULL) MPI_Type_free(&tail);
    RETURN_IF_ERROR(st);
    derived->push_back(block);
    TRY_MPI(MPI_Type_commit, &derived->back());
    *mpi_count = 1, *mpi_displ = 0, *mpi_type_out = derived->back();
    return Status::OK();
  }

  Status check_p2p(int64_t bytes, int peer, int tag) const {
    if (bytes < 0) return Status::InvalidArgument("negative byte count");
    if (peer < 0 || peer >= size()) return Status::InvalidArgument(fmt::format("peer {} out of range", peer));
    if (tag < 0) return Status::InvalidArgument(fmt::format("tag {} < 0", tag));
    return Status::OK();
  }

  // Posts post(offset, n, &request) for consecutive chunks of at most
  // mpi_chunk_limit() elements covering [0, count); at least one, so
  // zero-length operations still match up across ranks.
  template <typename Post>
  void for_each_chunk(MpiWork& w, int64_t count, Post post) {
    const int64_t limit = mpi_chunk_limit();
    int64_t off = 0;
    do {
      const int n = static_cast<int>(std::min(limit, count - off));
      MPI_Request req;
      Status st = post(off, n, &req);
      if (!st.ok()) return w.fail(st);
      w.add(req);
      off += n;
    } while (off < count);
  }

  MPI_Comm comm_;
  std::shared_ptr<const CommInfo> info_;
  uint64_t seq_ = 0;  // operations posted on this communicator
};

// Start-up under the job's deadline (issue #18 item 5: a rank stopped before
// MPI initialisation completed hung the job with no error). MPI_Init and the
// collectives that follow block in MPI's own code, where no deadline of ours
// reaches, so a thread watches them: if mpi_world() has not returned within
// the timeout, it prints one line naming this rank, its host and the phase,
// and exits with status 1, which makes mpirun end the job. The rank that did
// not arrive is the one whose line is missing.
class StartupWatchdog {
 public:
  explicit StartupWatchdog(std::chrono::milliseconds timeout) : timeout_(timeout) {
    if (timeout_.count() <= 0) return;
    thread_ = std::thread([this] { watch(); });
  }
  ~StartupWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void phase(const char* what) { phase_.store(what); }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, timeout_, [this] { return done_; })) return;
    // The launcher's variables: MPI may not be initialised yet.
    auto env = [](std::initializer_list<const char*> names) -> std::string {
      for (const char* n : names)
        if (const char* v = std::getenv(n)) return v;
      return "?";
    };
    std::fprintf(stderr,
                 "tessera: error: rank %s of %s on host %s: start-up did not finish within %.1f s (waiting in %s: a "
                 "rank did not arrive)\n",
                 env({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}).c_str(),
                 env({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}).c_str(), host_name().c_str(),
                 std::chrono::duration<double>(timeout_).count(), phase_.load());
    std::fflush(stderr);
    std::fflush(stdout);
    _exit(1);
  }

  std::chrono::milliseconds timeout_;
  std::atomic<const char*> phase_{"MPI initialisation"};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

bool launched_under_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr) return true;
  int init = 0;
  MPI_Initialized(&init);
  return init != 0;
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, std::max(0, len));
  if (size_t nl = s.find_first_of("\r\n"); nl != std::string::npos) s.resize(nl);
  if (size_t comma = s.find(','); comma != std::string::npos) s.resize(comma);
  return s;
}

Result<std::unique_ptr<Communicator>> mpi_world(const CommOptions& options) {
  StartupWatchdog watchdog(options.timeout);
  RETURN_IF_ERROR(ensure_mpi_initialised());
  watchdog.phase("the communicator's duplication");
  auto info = std::make_shared<CommInfo>();
  info->name = "world";
  info->timeout = options.timeout;
  int size = 0;
  TRY_MPI(MPI_Comm_rank, MPI_COMM_WORLD, &info->rank);
  TRY_MPI(MPI_Comm_size, MPI_COMM_WORLD, &size);
  for (int r = 0; r < size; r++) info->world_ranks.push_back(r);
  traffic().set_world_size(size);
  // Our own duplicate, so Tessera's traffic never matches anyone else's.
  MPI_Comm comm;
  MPI_Request req;
  TRY_MPI(MPI_Comm_idup, MPI_COMM_WORLD, &comm, &req);
  MpiWork dup(info, OpDesc{"comm_dup"}, 0, info->timeout);
  dup.add(req);
  RETURN_IF_ERROR(dup.wait());
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  // Learn every rank's host once, for timeout messages.
  constexpr int kHostLen = 64;
  char mine[kHostLen] = {};
  std::snprintf(mine, kHostLen, "%s", host_name().c_str());
  std::vector<char> all(static_cast<size_t>(kHostLen) * size);
  MPI_Request host_req;
  TRY_MPI(MPI_Iallgather, mine, kHostLen, MPI_CHAR, all.data(), kHostLen, MPI_CHAR, comm, &host_req);
  watchdog.phase("the host exchange");
  MpiWork hosts(info, OpDesc{"host_exchange"}, 0, info->timeout);
  hosts.add(host_req);
  RETURN_IF_ERROR(hosts.wait());
  if (mpi_process().health == MPI_COMM_NULL) {
    watchdog.phase("the health communicator's duplication");
    TRY_MPI(MPI_Comm_dup, MPI_COMM_WORLD, &mpi_process().health);
    MPI_Comm_set_errhandler(mpi_process().health, MPI_ERRORS_RETURN);
  }
  std::vector<std::string>& world_hosts = mpi_process().world_hosts;
  world_hosts.clear();
  for (int r = 0; r < size; r++) world_hosts.emplace_back(all.data() + static_cast<size_t>(r) * kHostLen);
  return std::unique_ptr<Communicator>(new MpiCommunicator(comm, std::move(info)));
}

Result<std::unique_ptr<Communicator>> world_communicator(const CommOptions& options) {
  if (launched_under_mpi()) return mpi_world(options);
  // A Slurm step of several tasks with no PMI (srun --mpi=none, or a site
  // whose MpiDefault is none): each task would run alone as rank 0.
  if (const char* n = std::getenv("SLURM_STEP_NUM_TASKS"); n != nullptr && std::atoi(n) > 1)
    return Status::InvalidArgument(fmt::format(
        "srun started {} tasks without PMI, so each would run alone as rank 0 of 1; start them with `srun "
        "--mpi=pmix` (Debian's OpenMPI talks PMIx; `srun --mpi=list` shows what this Slurm has)",
        n));
  return self_communicator();
}

void mpi_finalize() {
  MpiProcess& p = mpi_process();
  if (!p.we_initialised || !mpi_active()) return;
  std::vector<MPI_Request>& orphans = p.orphans;
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  int done = orphans.empty();
  while (!done && Clock::now() < give_up) {
    MPI_Testall(static_cast<int>(orphans.size()), orphans.data(), &done, MPI_STATUSES_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!done)
    abort_job(Status::Internal(fmt::format("{} MPI operation(s) abandoned before completing were still pending "
                                           "at exit; aborting the job instead of hanging in MPI_Finalize",
                                           orphans.size())));
  orphans.clear();
  p.orphan_keep.clear();
  if (p.health != MPI_COMM_NULL) MPI_Comm_free(&p.health);
  MPI_Finalize();
}

void abort_job(const Status& status) {
  static std::atomic<bool> printed{false};
  if (!printed.exchange(true)) {
    std::fprintf(stderr, "tessera: error: %s\n", status.message().c_str());
    std::fflush(stderr);
  }
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::fflush(stdout);
  _exit(1);
}

int64_t mpi_chunk_limit() { return mpi_process().chunk_limit; }

void set_mpi_chunk_limit_for_testing(int64_t elements) {
  CHECK(elements >= 1 && elements <= INT_MAX);
  mpi_process().chunk_limit = elements;
}

}  // namespace tessera::comm

// tessera bench allreduce | reduce_scatter | all_gather | broadcast | sendrecv:
// collective bandwidth with nccl-tests' semantics (its doc/PERFORMANCE.md).
//
// For a size S bytes of the given type (count = S / typesize):
//   all_reduce      count elements in and out; algbw = S/t, busbw = algbw * 2(n-1)/n
//   reduce_scatter  n*(count/n) in, count/n out; algbw = n*(count/n)*ts/t, busbw = algbw * (n-1)/n
//   all_gather      count/n in, n*(count/n) out; algbw = n*(count/n)*ts/t, busbw = algbw * (n-1)/n
//   broadcast       count elements from rank 0; busbw = algbw = S/t
//   sendrecv        S bytes to the next rank, S from the previous; busbw = algbw = S/t
// The size column is the larger of the two buffers, the count column the
// count passed to the operation (per rank), as nccl-tests prints them. time is
// the mean over -n iterations after -w warm-up ones, the maximum over ranks.
// Run under mpirun for n ranks; without it, one rank (the self communicator).
//
// --backend nccl: the same operations on the NCCL communicator, one GPU per
// rank (local rank % device count), buffers in device memory (filled and
// checked through host copies). The timed iterations are posted back to back
// on the communicator's stream and the time runs until the last one's event
// has completed (nccl-tests' stream-synchronised timing); the MPI backend
// waits for each iteration in turn. Times are still reduced (max) over MPI.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "comm/mpi/local_device.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/nccl_factory.h"
#include "runtime/cuda_device.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

using comm::Communicator;
using comm::ElemType;
using Clock = std::chrono::steady_clock;

enum class CommOp { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSendRecv };

struct CommBenchArgs {
  CommOp op = CommOp::kAllReduce;
  std::string name;  // the subcommand
  std::string min_bytes = "8", max_bytes = "64M";
  int factor = 2;
  int iters = 20, warmup = 5, check = 1;
  bool json = false;
  double link_gbps = 0;  // 0: not given
  std::string dtype = "float";
  std::string backend = "mpi";  // mpi | nccl
};

Result<ElemType> parse_dtype(const std::string& s) {
  for (ElemType t : {ElemType::kF32, ElemType::kF64, ElemType::kI32, ElemType::kI64, ElemType::kU64, ElemType::kU8})
    if (s == comm::elem_name(t)) return t;
  return Status::InvalidArgument(
      fmt::format("--dtype: unknown type '{}' (float, double, int32, int64, uint64, uint8)", s));
}

// Buffer sizes and bandwidth factors of one row.
struct Layout {
  int64_t send_count = 0, recv_count = 0;  // elements in each buffer
  int64_t param_count = 0;                 // the count passed to the operation
  int64_t size_bytes = 0;                  // the larger buffer (the size column)
  double alg_bytes = 0;                    // bytes algbw divides by the time
  double bus_factor = 1;                   // busbw = algbw * bus_factor
};

Layout layout_of(CommOp op, int64_t bytes, int64_t ts, int n) {
  const int64_t count = bytes / ts;
  Layout l;
  switch (op) {
    case CommOp::kAllReduce:
      l.send_count = l.recv_count = l.param_count = count;
      l.bus_factor = 2.0 * (n - 1) / n;
      break;
    case CommOp::kReduceScatter:
      l.param_count = l.recv_count = count / n;
      l.send_count = l.recv_count * n;
      l.bus_factor = double(n - 1) / n;
      break;
    case CommOp::kAllGather:
      l.param_count = l.send_count = count / n;
      l.recv_count = l.send_count * n;
      l.bus_factor = double(n - 1) / n;
      break;
    case CommOp::kBroadcast:
    case CommOp::kSendRecv:
      l.send_count = l.recv_count = l.param_count = count;
      break;
  }
  l.size_bytes = std::max(l.send_count, l.recv_count) * ts;
  l.alg_bytes = (op == CommOp::kReduceScatter || op == CommOp::kAllGather) ? double(l.param_count) * n * ts
                                                                           : double(count) * ts;
  return l;
}

// Rank r's element i: small integers, so float sums are exact and every
// rank can compute every other rank's data to check results.
template <typename T>
T pattern(int64_t i, int r) {
  return static_cast<T>((i * 7 + r * 3 + 1) % 17);
}

// Host vectors, and with --backend nccl their device twins (which the
// operations then use; the host side only fills and checks).
template <typename T>
struct Buffers {
  std::vector<T> send, recv;
  void* dev_send = nullptr;
  void* dev_recv = nullptr;
  bool on_device = false;

  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    (void)cuda::device_free(dev_send);
    (void)cuda::device_free(dev_recv);
  }
  // Device buffers of the host ones' sizes (at least one element each).
  Status to_device() {
    on_device = true;
    ASSIGN_OR_RETURN(dev_send, cuda::device_malloc(std::max<size_t>(send.size(), 1) * sizeof(T)));
    ASSIGN_OR_RETURN(dev_recv, cuda::device_malloc(std::max<size_t>(recv.size(), 1) * sizeof(T)));
    return upload();
  }
  Status upload() {
    if (!on_device) return Status::OK();
    RETURN_IF_ERROR(cuda::memcpy_h2d(dev_send, send.data(), send.size() * sizeof(T)));
    return cuda::memcpy_h2d(dev_recv, recv.data(), recv.size() * sizeof(T));
  }
  Status download_recv() {
    if (!on_device) return Status::OK();
    return cuda::memcpy_d2h(recv.data(), dev_recv, recv.size() * sizeof(T));
  }
  void* send_ptr() { return on_device ? dev_send : send.data(); }
  void* recv_ptr() { return on_device ? dev_recv : recv.data(); }
};

// Posts one iteration of the operation; its Works go to `out`.
template <typename T>
void post_once(Communicator& c, CommOp op, Buffers<T>& b, const Layout& l, ElemType et,
               std::vector<std::unique_ptr<comm::Work>>& out) {
  const int n = c.size(), r = c.rank();
  switch (op) {
    case CommOp::kAllReduce:
      out.push_back(c.all_reduce_async(b.send_ptr(), b.recv_ptr(), l.param_count, et, comm::ReduceOp::kSum));
      return;
    case CommOp::kReduceScatter:
      out.push_back(c.reduce_scatter_async(b.send_ptr(), b.recv_ptr(), l.param_count, et, comm::ReduceOp::kSum));
      return;
    case CommOp::kAllGather: out.push_back(c.all_gather_async(b.send_ptr(), b.recv_ptr(), l.param_count, et)); return;
    case CommOp::kBroadcast: out.push_back(c.broadcast_async(b.recv_ptr(), l.param_count, et, 0)); return;
    case CommOp::kSendRecv: {
      const int64_t bytes = l.param_count * static_cast<int64_t>(sizeof(T));
      out.push_back(c.recv_async(b.recv_ptr(), bytes, (r + n - 1) % n, 0));
      out.push_back(c.send_async(b.send_ptr(), bytes, (r + 1) % n, 0));
      out.back()->test();  // starts the pair now (NCCL queues p2p until a Work is tested or waited)
      return;
    }
  }
}

Status wait_all(std::vector<std::unique_ptr<comm::Work>>& works) {
  Status first;
  for (auto& w : works) {
    Status st = w->wait();
    if (first.ok()) first = st;
  }
  works.clear();
  return first;
}

template <typename T>
Status run_once(Communicator& c, CommOp op, Buffers<T>& b, const Layout& l, ElemType et) {
  std::vector<std::unique_ptr<comm::Work>> works;
  post_once(c, op, b, l, et, works);
  return wait_all(works);
}

// Fills the inputs, runs the operation once and counts the wrong elements of
// this rank's output.
template <typename T>
Result<int64_t> check_once(Communicator& c, CommOp op, Buffers<T>& b, const Layout& l, ElemType et) {
  const int n = c.size(), r = c.rank();
  for (int64_t i = 0; i < l.send_count; i++) b.send[i] = pattern<T>(i, r);
  std::fill(b.recv.begin(), b.recv.end(), T(99));
  if (op == CommOp::kBroadcast && r == 0)
    for (int64_t i = 0; i < l.recv_count; i++) b.recv[i] = pattern<T>(i, 0);
  RETURN_IF_ERROR(b.upload());
  RETURN_IF_ERROR(run_once(c, op, b, l, et));
  RETURN_IF_ERROR(b.download_recv());
  int64_t wrong = 0;
  for (int64_t i = 0; i < l.recv_count; i++) {
    T want{};
    switch (op) {
      case CommOp::kAllReduce:
        for (int q = 0; q < n; q++) want = static_cast<T>(want + pattern<T>(i, q));
        break;
      case CommOp::kReduceScatter:
        for (int q = 0; q < n; q++) want = static_cast<T>(want + pattern<T>(r * l.recv_count + i, q));
        break;
      case CommOp::kAllGather: want = pattern<T>(i % l.send_count, static_cast<int>(i / l.send_count)); break;
      case CommOp::kBroadcast: want = pattern<T>(i, 0); break;
      case CommOp::kSendRecv: want = pattern<T>(i, (r + n - 1) % n); break;
    }
    wrong += b.recv[i] != want;
  }
  return wrong;
}

struct Row {
  Layout layout;
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked
};

// c: the communicator measured; host: the MPI (or self) one, for the
// timing and error-count reductions on host memory.
template <typename T>
Result<Row> bench_size(Communicator& c, Communicator& host, const CommBenchArgs& a, int64_t bytes, ElemType et) {
  Row row;
  row.layout = layout_of(a.op, bytes, sizeof(T), c.size());
  const Layout& l = row.layout;
  const bool on_device = &c != &host;
  Buffers<T> b;
  b.send.assign(l.send_count, T(1));
  b.recv.assign(l.recv_count, T(0));
  if (on_device) RETURN_IF_ERROR(b.to_device());
  for (int i = 0; i < a.warmup; i++) RETURN_IF_ERROR(run_once(c, a.op, b, l, et));
  RETURN_IF_ERROR(c.barrier());
  const auto t0 = Clock::now();
  if (on_device) {
    // Back to back on the stream; done when the last has completed.
    std::vector<std::unique_ptr<comm::Work>> works;
    for (int i = 0; i < a.iters; i++) post_once(c, a.op, b, l, et, works);
    RETURN_IF_ERROR(wait_all(works));
  } else {
    for (int i = 0; i < a.iters; i++) RETURN_IF_ERROR(run_once(c, a.op, b, l, et));
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count() / a.iters;
  RETURN_IF_ERROR(host.all_reduce(&seconds, &seconds, 1, ElemType::kF64, comm::ReduceOp::kMax));
  row.time_us = seconds * 1e6;
  row.algbw = l.alg_bytes / seconds / 1e9;
  row.busbw = row.algbw * l.bus_factor;
  if (a.check) {
    ASSIGN_OR_RETURN(row.wrong, check_once(c, a.op, b, l, et));
    RETURN_IF_ERROR(host.all_reduce(&row.wrong, &row.wrong, 1, ElemType::kI64));
  }
  return row;
}

Result<Row> bench_size(Communicator& c, Communicator& host, const CommBenchArgs& a, int64_t bytes, ElemType et) {
  switch (et) {
    case ElemType::kF32: return bench_size<float>(c, host, a, bytes, et);
    case ElemType::kF64: return bench_size<double>(c, host, a, bytes, et);
    case ElemType::kI32: return bench_size<int32_t>(c, host, a, bytes, et);
    case ElemType::kI64: return bench_size<int64_t>(c, host, a, bytes, et);
    case ElemType::kU64: return bench_size<uint64_t>(c, host, a, bytes, et);
    case ElemType::kU8: return bench_size<uint8_t>(c, host, a, bytes, et);
  }
  return Status::Internal("unknown type");
}

double pct_of_link(double busbw_gbs, double link_gbps) { return busbw_gbs * 8.0 / link_gbps * 100.0; }

void print_row(const CommBenchArgs& a, const Row& r, const char* type) {
  const Layout& l = r.layout;
  if (a.json) {
    std::string wrong = r.wrong < 0 ? "null" : fmt::format("{}", r.wrong);
    std::string pct = a.link_gbps > 0 ? fmt::format(", \"pct_of_link\": {:.2f}", pct_of_link(r.busbw, a.link_gbps)) : "";
    std::printf("{\"size\": %lld, \"count\": %lld, \"type\": \"%s\", \"time_us\": %.2f, \"algbw\": %.4f, "
                "\"busbw\": %.4f, \"wrong\": %s%s}\n",
                static_cast<long long>(l.size_bytes), static_cast<long long>(l.param_count), type, r.time_us,
                r.algbw, r.busbw, wrong.c_str(), pct.c_str());
  } else {
    std::string wrong = r.wrong < 0 ? "N/A" : fmt::format("{}", r.wrong);
    std::printf("%12lld  %12lld  %6s  %9.1f  %7.2f  %7.2f  %6s", static_cast<long long>(l.size_bytes),
                static_cast<long long>(l.param_count), type, r.time_us, r.algbw, r.busbw, wrong.c_str());
    if (a.link_gbps > 0) std::printf("  %6.1f", pct_of_link(r.busbw, a.link_gbps));
    std::printf("\n");
  }
  std::fflush(stdout);
}

int run_comm_bench(const CommBenchArgs& a) {
  auto min_bytes = parse_size("-b", a.min_bytes);
  if (!min_bytes.ok()) return usage_error(min_bytes.status().message());
  auto max_bytes = parse_size("-e", a.max_bytes);
  if (!max_bytes.ok()) return usage_error(max_bytes.status().message());
  auto dtype = parse_dtype(a.dtype);
  if (!dtype.ok()) return usage_error(dtype.status().message());
  if (*min_bytes > *max_bytes)
    return usage_error(fmt::format("-b {} is larger than -e {}", a.min_bytes, a.max_bytes));
  if (a.factor < 2) return usage_error(fmt::format("-f {}: the step factor must be at least 2", a.factor));
  if (a.iters < 1) return usage_error(fmt::format("-n {}: need at least one iteration", a.iters));
  if (a.warmup < 0) return usage_error(fmt::format("-w {}: warm-up iterations must be >= 0", a.warmup));
  if (a.link_gbps < 0) return usage_error(fmt::format("--link-gbps {} must be positive", a.link_gbps));

  auto world = comm::world_communicator();
  if (!world.ok()) return fail(world.status());
  // The measured communicator: the world itself (MPI), or NCCL over it.
  std::unique_ptr<Communicator> nccl;
  std::string backend_desc = "mpi";
  if (a.backend == "nccl") {
    // Every failure ends the whole job: the other ranks may be waiting in a
    // collective for this one.
    if (!comm::nccl_compiled())  // says why (no CUDA backend, or NCCL not found)
      comm::abort_job(comm::make_nccl_communicator(**world, "bench").status().With(
          fmt::format("bench {} --backend nccl", a.name)));
    const size_t need = 2 * static_cast<size_t>(*max_bytes) + (size_t{64} << 20);  // buffers + NCCL's own
    Result<int> device = comm::select_local_device(need);
    if (!device.ok()) comm::abort_job(device.status().With(fmt::format("bench {} --backend nccl", a.name)));
    auto made = comm::make_nccl_communicator(**world, "bench");
    if (!made.ok()) comm::abort_job(made.status().With(fmt::format("bench {} --backend nccl", a.name)));
    nccl = std::move(made).value();
    backend_desc = fmt::format("nccl (NCCL {}, rank 0 on cuda:{}: {})", comm::nccl_version(), device.value(),
                               cuda::device_summary(device.value()));
  }
  Communicator& c = nccl ? *nccl : **world;
  const bool root = c.rank() == 0;
  const char* type = comm::elem_name(*dtype);
  if (root && !a.json) {
    std::printf("# tessera bench %s: %d rank(s)%s, backend %s, type %s, minBytes %lld maxBytes %lld step %d(factor) "
                "warmup %d iters %d check %d\n#\n",
                a.name.c_str(), c.size(), comm::launched_under_mpi() ? " (MPI)" : " (no mpirun: self)",
                backend_desc.c_str(), type, static_cast<long long>(*min_bytes), static_cast<long long>(*max_bytes),
                a.factor, a.warmup, a.iters, a.check);
    std::printf("# %10s  %12s  %6s  %9s  %7s  %7s  %6s%s\n", "size", "count", "type", "time", "algbw", "busbw",
                "#wrong", a.link_gbps > 0 ? "  %link" : "");
    std::printf("# %10s  %12s  %6s  %9s  %7s  %7s  %6s\n", "(B)", "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  std::vector<Row> rows;
  int64_t total_wrong = 0;
  for (int64_t bytes = *min_bytes; bytes <= *max_bytes; bytes *= a.factor) {
    Result<Row> row = bench_size(c, **world, a, bytes, *dtype);
    if (!row.ok()) comm::abort_job(row.status().With(fmt::format("bench {} at {} bytes", a.name, bytes)));
    rows.push_back(*row);
    total_wrong += std::max<int64_t>(row->wrong, 0);
    if (root) print_row(a, *row, type);
  }
  double avg_busbw = 0;
  for (const Row& r : rows) avg_busbw += r.busbw / rows.size();
  const Row& large = rows.back();
  const double large_pct = a.link_gbps > 0 ? pct_of_link(large.busbw, a.link_gbps) : 0;
  if (root && a.json) {
    std::string link = a.link_gbps > 0 ? fmt::format(", \"link_gbps\": {}, \"large_pct_of_link\": {:.2f}, "
                                                     "\"reached_90pct\": {}",
                                                     a.link_gbps, large_pct, large_pct >= 90.0)
                                       : "";
    std::printf("{\"summary\": \"%s\", \"ranks\": %d, \"avg_busbw\": %.4f, \"large_busbw\": %.4f, "
                "\"total_wrong\": %lld%s, \"backend\": \"%s\"}\n",
                a.name.c_str(), c.size(), avg_busbw, large.busbw, static_cast<long long>(total_wrong), link.c_str(),
                a.backend.c_str());
  } else if (root) {
    if (a.check) std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                             total_wrong == 0 ? "OK" : "WRONG");
    std::printf("# Avg bus bandwidth    : %g\n", avg_busbw);
    if (a.link_gbps > 0)
      std::printf("# Verdict: busbw at %lld B is %.2f GB/s = %.1f Gbit/s, %.1f%% of the %g Gbit/s link: %s\n",
                  static_cast<long long>(large.layout.size_bytes), large.busbw, large.busbw * 8, large_pct,
                  a.link_gbps, large_pct >= 90.0 ? "reached 90% of theoretical" : "below 90% of theoretical");
  }
  std::fflush(stdout);
  nccl.reset();
  world->reset();
  comm::mpi_finalize();
  return total_wrong == 0 ? kExitOk : kExitError;
}

}  // namespace

void add_bench_comm_commands(CLI::App& bench) {
  struct Sub {
    const char* name;
    CommOp op;
    const char* help;
  };
  const Sub subs[] = {
      {"allreduce", CommOp::kAllReduce, "all_reduce (sum) bandwidth, nccl-tests style; run under mpirun"},
      {"reduce_scatter", CommOp::kReduceScatter, "reduce_scatter (sum) bandwidth, nccl-tests style"},
      {"all_gather", CommOp::kAllGather, "all_gather bandwidth, nccl-tests style"},
      {"broadcast", CommOp::kBroadcast, "broadcast (root 0) bandwidth, nccl-tests style"},
      {"sendrecv", CommOp::kSendRecv, "send to the next rank, receive from the previous, nccl-tests style"},
  };
  for (const Sub& s : subs) {
    auto a = std::make_shared<CommBenchArgs>();
    a->op = s.op;
    a->name = s.name;
    CLI::App* cmd = bench.add_subcommand(s.name, s.help);
    cmd->add_option("-b,--minbytes", a->min_bytes, "smallest size, bytes (K/M/G suffixes)");
    cmd->add_option("-e,--maxbytes", a->max_bytes, "largest size, bytes (K/M/G suffixes)");
    cmd->add_option("-f,--stepfactor", a->factor, "multiply the size by this between rows (>= 2)");
    cmd->add_option("-n,--iters", a->iters, "timed iterations per size (the mean is reported)");
    cmd->add_option("-w,--warmup_iters", a->warmup, "untimed iterations first");
    cmd->add_option("-c,--check", a->check, "1: check results once per size and count wrong elements");
    cmd->add_flag("--json", a->json, "one JSON object per size on stdout (and a summary object)");
    cmd->add_option("--link-gbps", a->link_gbps, "link speed in Gbit/s: report busbw as % of it");
    cmd->add_option("--dtype", a->dtype, "float, double, int32, int64, uint64 or uint8");
    cmd->add_option("--backend", a->backend, "mpi (host buffers) or nccl (one GPU per rank, device buffers)")
        ->check(CLI::IsMember({"mpi", "nccl"}));
    cmd->callback([a] { exit_code() = run_comm_bench(*a); });
  }
  add_bench_p2p_command(bench);  // p2p: every pair's bandwidth and latency (cmd_bench_p2p.cc)
}

}  // namespace tessera::tools

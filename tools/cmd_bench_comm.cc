// tessera bench allreduce | reduce_scatter | all_gather | broadcast | sendrecv | alltoall:
// collective bandwidth with nccl-tests' semantics (its doc/PERFORMANCE.md).
//
// The measurement and its semantics (nccl-tests' algbw and busbw) are in
// perf/comm_bench.h; this file owns the flags and the table.
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
#include "perf/comm_bench.h"
#include "runtime/cuda_device.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

using comm::Communicator;
using comm::ElemType;

using perf::CommOp;

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

using Row = perf::CollectiveResult;

double pct_of_link(double busbw_gbs, double link_gbps) { return busbw_gbs * 8.0 / link_gbps * 100.0; }

void print_row(const CommBenchArgs& a, const Row& r, const char* type) {
  const perf::CommLayout& l = r.layout;
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
    perf::CollectiveOptions o;
    o.op = a.op;
    o.iters = a.iters;
    o.warmup = a.warmup;
    o.check = a.check != 0;
    Result<Row> row = perf::bench_collective(c, **world, o, bytes, *dtype, /*on_device=*/nccl != nullptr);
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
      {"alltoall", CommOp::kAllToAll, "all_to_all (size/n to every rank) bandwidth, nccl-tests style"},
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

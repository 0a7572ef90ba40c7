#include "perf/doctor.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#include <fmt/format.h>

#include "comm/agree.h"
#include "comm/mpi/local_device.h"
#include "comm/nccl/nccl_factory.h"
#include "perf/comm_bench.h"
#include "perf/cpu_checks.h"
#include "perf/gpu_checks.h"
#include "runtime/cuda_device.h"

namespace tessera::perf {

namespace {

void say(const DoctorOptions& o, const std::string& line) {
  if (o.progress) o.progress(line);
}

void add(Profile* p, std::string name, double value, const char* unit, Better better) {
  p->figures.push_back({std::move(name), value, unit, better});
}

// Thread counts for the scaling check: 1, 2, 4, ... and the core count.
std::vector<int> thread_counts(int cores) {
  std::vector<int> out;
  for (int n = 1; n < cores; n *= 2) out.push_back(n);
  out.push_back(std::max(cores, 1));
  return out;
}

void gemm_checks(const DoctorOptions& o, Profile* p) {
  std::vector<GemmShape> shapes = doctor_gemm_shapes(o.quick);
  if (o.tiny)
    shapes = {{128, 128, 128}, {256, 256, 256}, {64, 768, 768}, {64, 3072, 768}};
  const int iters = o.tiny ? 1 : o.quick ? 3 : 20;
  for (GemmDtype d : {GemmDtype::kFP32, GemmDtype::kBF16, GemmDtype::kINT8}) {
    const char* name = gemm_dtype_name(d);
    if (std::string why = gemm_skip_reason(d); !why.empty()) {
      say(o, fmt::format("skipped cpu.gemm.{}: {}", name, why));
      continue;
    }
    say(o, fmt::format("gemm {}: {} shapes", name, shapes.size()));
    const char* unit = d == GemmDtype::kINT8 ? "GOP/s" : "GFLOP/s";
    double peak = 0;
    for (const GemmShape& s : shapes) {
      const double g = gemm_gflops(s, d, iters);
      peak = std::max(peak, g);
      add(p, fmt::format("cpu.gemm.{}.{}x{}x{}", name, s.M, s.N, s.K), g, unit, Better::kHigher);
    }
    add(p, fmt::format("cpu.gemm.{}.peak", name), peak, unit, Better::kHigher);
  }
}

// A launcher binds each rank to a core and sets OMP_NUM_THREADS=1 (tessera
// launch does); the machine's figures need every CPU: widen this thread's
// affinity (OpenMP's threads, created later, inherit it) and the OpenMP
// thread count. Before any parallel region, so the pool starts wide.
void use_whole_machine(int threads) {
  cpu_set_t all;
  CPU_ZERO(&all);
  const long n = sysconf(_SC_NPROCESSORS_CONF);
  for (long i = 0; i < n && i < CPU_SETSIZE; i++) CPU_SET(i, &all);
  sched_setaffinity(0, sizeof(all), &all);  // the cpuset still limits it; failure leaves the old mask
  omp_set_num_threads(std::max(threads, 1));
}

}  // namespace

std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Status run_local_checks(const DoctorOptions& o, Profile* p) {
  const int cores = p->machine.cores;
  use_whole_machine(p->machine.threads);
  gemm_checks(o, p);

  say(o, "memory: STREAM triad");
  const int64_t triad_n = o.tiny ? int64_t{1} << 22 : o.quick ? int64_t{1} << 24 : int64_t{1} << 25;
  add(p, "cpu.mem.triad", triad_gb_per_s(triad_n, o.tiny ? 2 : o.quick ? 5 : 10), "GB/s", Better::kHigher);
  say(o, "memory: read roof (what a decode step's weight reads can reach)");
  const int64_t read_n = o.tiny ? int64_t{1} << 21 : o.quick ? int64_t{1} << 25 : int64_t{1} << 26;
  add(p, "cpu.mem.read", read_gb_per_s(read_n, o.tiny ? 2 : o.quick ? 5 : 10), "GB/s", Better::kHigher);

  say(o, "allocation: malloc 1 MiB, page faults");
  add(p, "cpu.alloc.malloc_1mb_ns", malloc_ns(size_t{1} << 20, o.tiny ? 200 : o.quick ? 1000 : 5000), "ns",
      Better::kLower);
  add(p, "cpu.alloc.page_fault_ns", page_fault_ns(static_cast<size_t>(o.tiny ? 16 : o.quick ? 64 : 256) << 20), "ns",
      Better::kLower);

  const std::vector<int> counts = thread_counts(cores);
  say(o, fmt::format("thread scaling: fp32 gemm on {} thread count(s)", counts.size()));
  const int n = o.tiny ? 256 : 1024;
  for (int t : counts)
    add(p, fmt::format("cpu.threads.{}.fp32", t), threads_fp32_gflops(t, n, o.tiny ? 1 : o.quick ? 3 : 20), "GFLOP/s",
        Better::kHigher);

  const int64_t disk_bytes = int64_t{o.tiny ? 8 : o.quick ? 64 : 256} << 20;
  say(o, fmt::format("disk: write {} MiB with fsync in {}", disk_bytes >> 20, o.disk_dir));
  ASSIGN_OR_RETURN(double mbs, disk_write_fsync_mb_per_s(o.disk_dir, disk_bytes));
  add(p, "disk.write_fsync", mbs, "MB/s", Better::kHigher);

  if (!p->machine.device) {
    Result<int> devices = cuda::query_device_count();
    say(o, fmt::format("skipped gpu checks: no CUDA device ({})",
                       !cuda::compiled() ? "CUDA support not compiled in"
                       : devices.ok()    ? "none visible"
                                         : devices.status().message()));
  } else {
    say(o, fmt::format("gpu: {}", p->machine.device->name));
    Status st = run_gpu_checks(o.quick || o.tiny, &p->figures);
    if (!st.ok()) say(o, fmt::format("skipped the remaining gpu checks: {}", st.message()));
  }
  return Status::OK();
}

Status run_comm_checks(comm::Communicator& world, const DoctorOptions& o, Profile* p) {
  const int n = world.size();
  Result<comm::LocalRank> local = comm::local_rank();
  const int per_host = local.ok() && local->size > 0 ? local->size : 1;
  p->comm_ranks = n;
  p->comm_hosts = (n + per_host - 1) / per_host;
  const bool root = world.rank() == 0;
  std::vector<int64_t> sizes = o.tiny    ? std::vector<int64_t>{1 << 10, 1 << 20}
                               : o.quick ? std::vector<int64_t>{1 << 10, 1 << 16, 1 << 20, 1 << 24}
                                         : std::vector<int64_t>{1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22,
                                                                1 << 24, 1 << 26};
  CollectiveOptions co;
  co.iters = o.tiny ? 3 : o.quick ? 5 : 20;
  co.warmup = o.tiny ? 1 : o.quick ? 2 : 5;
  co.check = true;
  for (CommOp op : {CommOp::kAllReduce, CommOp::kReduceScatter, CommOp::kAllGather}) {
    if (root) say(o, fmt::format("comm {}: {} sizes on {} ranks", comm_op_name(op), sizes.size(), n));
    co.op = op;
    for (int64_t bytes : sizes) {
      ASSIGN_OR_RETURN(CollectiveResult r, bench_collective(world, world, co, bytes, comm::ElemType::kF32, false));
      if (r.wrong > 0)
        return Status::Internal(fmt::format("comm {} at {} bytes: {} wrong elements", comm_op_name(op), bytes, r.wrong));
      add(p, fmt::format("comm.{}.busbw.{}", comm_op_name(op), bytes), r.busbw, "GB/s", Better::kHigher);
      add(p, fmt::format("comm.{}.time_us.{}", comm_op_name(op), bytes), r.time_us, "us", Better::kLower);
    }
  }

  P2pOptions po;
  po.iters = o.tiny ? 2 : o.quick ? 3 : 10;
  po.warmup = 1;
  po.lat_iters = o.tiny ? 20 : o.quick ? 50 : 200;
  const int64_t bytes = int64_t{o.tiny ? 1 : o.quick ? 4 : 64} << 20;
  std::vector<char> buf(bytes, static_cast<char>(world.rank() + 1)), msg(8, 0);
  if (root) say(o, fmt::format("p2p: {} pairs, {} MiB transfers", n * (n - 1), bytes >> 20));
  for (int src = 0; src < n; src++)
    for (int dst = 0; dst < n; dst++) {
      if (src == dst) continue;
      ASSIGN_OR_RETURN(PairResult r, bench_pair(world, po, buf, msg, bytes, src, dst));
      add(p, fmt::format("comm.p2p.{}-{}.latency_us", src, dst), r.latency_s * 1e6, "us", Better::kLower);
      add(p, fmt::format("comm.p2p.{}-{}.bandwidth", src, dst), std::max(bytes / r.seconds_1, bytes / r.seconds_n) / 1e9,
          "GB/s", Better::kHigher);
    }

  // NCCL all-reduce, one GPU per rank, where NCCL and devices exist.
  if (!comm::nccl_compiled()) {
    if (root) say(o, "skipped gpu.nccl: NCCL not compiled in");
    return Status::OK();
  }
  const int64_t top = sizes.back();
  Result<int> device = comm::select_local_device(2 * static_cast<size_t>(top) + (size_t{64} << 20));
  // One rank without a device skips the NCCL rows on every rank (not an
  // error: the CPU rows stand).
  if (Status every = comm::agree(world, device.status()); !every.ok()) {
    if (root) say(o, fmt::format("skipped gpu.nccl: {}", every.message()));
    return Status::OK();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> nccl, comm::make_nccl_communicator(world, "doctor"));
  co.op = CommOp::kAllReduce;
  if (root) say(o, fmt::format("gpu nccl allreduce: {} sizes", sizes.size()));
  for (int64_t b : sizes) {
    ASSIGN_OR_RETURN(CollectiveResult r, bench_collective(*nccl, world, co, b, comm::ElemType::kF32, true));
    add(p, fmt::format("gpu.nccl.allreduce.busbw.{}", b), r.busbw, "GB/s", Better::kHigher);
  }
  return Status::OK();
}

}  // namespace tessera::perf

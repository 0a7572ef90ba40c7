// tessera bench p2p: iperf-style point-to-point bandwidth and latency between
// every ordered pair of ranks. Run under mpirun with at least 2 ranks.
//
// Pairs (src -> dst) are measured one at a time by perf::bench_pair
// (perf/comm_bench.h: what a transfer, a stream and the latency are).
// Rows are senders, columns receivers; both directions are measured, since
// links and NIC queues need not be symmetric. Gbit/s = 8 * bytes / time / 1e9
// (the unit links are sold in), GB/s = bytes / time / 1e9.
//
// Every wait has the Communicator's deadline: a peer that stops answering
// ends the job with the usual timeout error naming the operation and peer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "perf/comm_bench.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

using comm::Communicator;
using comm::ElemType;

constexpr int kMaxStreams = 1024;  // keeps tags far below MPI's guaranteed 32767

struct P2pArgs {
  std::string bytes = "64M";
  int streams = 4;
  int iters = 10, warmup = 2;
  std::string lat_size = "8";
  int lat_iters = 200;
  double link_gbps = 0;  // 0: not given
  bool json = false;
  double timeout_s = 300;  // the Communicator's deadline per wait
};

using perf::PairResult;

Result<PairResult> bench_pair(Communicator& c, const P2pArgs& a, std::vector<char>& buf, std::vector<char>& msg,
                              int64_t bytes, int src, int dst) {
  perf::P2pOptions o;
  o.streams = a.streams;
  o.iters = a.iters;
  o.warmup = a.warmup;
  o.lat_iters = a.lat_iters;
  return perf::bench_pair(c, o, buf, msg, bytes, src, dst);
}

double gbit_per_s(int64_t bytes, double seconds) { return bytes * 8.0 / seconds / 1e9; }
double pct_of(double gbps, double link_gbps) { return gbps / link_gbps * 100.0; }

// A P x P matrix on stdout; cell(i, j) formats one off-diagonal entry.
template <typename Cell>
void print_matrix(const std::string& title, int n, int width, Cell cell) {
  std::printf("\n# %s; rows = sender, columns = receiver\n", title.c_str());
  std::printf("%8s", "from\\to");
  for (int j = 0; j < n; j++) std::printf("%*d", width, j);
  std::printf("\n");
  for (int i = 0; i < n; i++) {
    std::printf("%8d", i);
    for (int j = 0; j < n; j++) std::printf("%*s", width, i == j ? "-" : cell(i, j).c_str());
    std::printf("\n");
  }
}

struct Stats {
  double min = 0, mean = 0, max = 0;
};

Stats stats_of(const std::vector<double>& v) {
  Stats s{v[0], 0, v[0]};
  for (double x : v) {
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
    s.mean += x / v.size();
  }
  return s;
}

int run_p2p_bench(const P2pArgs& a) {
  auto bytes = parse_size("-b", a.bytes);
  if (!bytes.ok()) return usage_error(bytes.status().message());
  if (*bytes < 1) return usage_error(fmt::format("-b {}: need at least one byte", a.bytes));
  auto lat_bytes = parse_size("--lat-size", a.lat_size);
  if (!lat_bytes.ok()) return usage_error(lat_bytes.status().message());
  if (a.streams < 1 || a.streams > kMaxStreams)
    return usage_error(fmt::format("--streams {}: need 1 to {} streams", a.streams, kMaxStreams));
  if (a.iters < 1) return usage_error(fmt::format("-n {}: need at least one iteration", a.iters));
  if (a.warmup < 0) return usage_error(fmt::format("-w {}: warm-up iterations must be >= 0", a.warmup));
  if (a.lat_iters < 1) return usage_error(fmt::format("--lat-iters {}: need at least one round trip", a.lat_iters));
  if (a.link_gbps < 0) return usage_error(fmt::format("--link-gbps {} must be positive", a.link_gbps));
  if (!(a.timeout_s > 0)) return usage_error(fmt::format("--timeout {} must be positive", a.timeout_s));

  comm::CommOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  auto world = comm::world_communicator(options);
  if (!world.ok()) return fail(world.status());
  Communicator& c = **world;
  const int n = c.size();
  const bool root = c.rank() == 0;
  if (n < 2) {
    // A self loopback would time memcpy, not a link: refuse instead.
    world->reset();
    comm::mpi_finalize();
    return fail(Status::InvalidArgument(
        fmt::format("bench p2p needs at least 2 ranks, got {} (run it as: mpirun -np 2 tessera bench p2p ...)", n)));
  }

  std::vector<char> buf, msg;
  try {
    buf.assign(*bytes, static_cast<char>(c.rank() + 1));  // touched now, so page faults stay out of the timing
    msg.assign(*lat_bytes, 0);
  } catch (const std::bad_alloc&) {
    comm::abort_job(Status::InvalidArgument(fmt::format("-b {}: cannot allocate {} bytes", a.bytes, *bytes)));
  }

  if (root && !a.json) {
    std::printf("# tessera bench p2p: %d ranks (MPI), %lld B per transfer, %d streams, warmup %d iters %d, "
                "latency %lld B x %d\n",
                n, static_cast<long long>(*bytes), a.streams, a.warmup, a.iters, static_cast<long long>(*lat_bytes),
                a.lat_iters);
    std::printf("# every ordered pair alone (the other ranks wait); time = mean per transfer, max of the two ranks\n");
    std::printf("# streams = concurrent MPI messages (distinct tags) on one connection, not separate TCP\n"
                "# connections unless OpenMPI's btl_tcp_links is raised (--mca btl_tcp_links N)\n");
    std::fflush(stdout);
  }

  // results[src * n + dst]
  std::vector<PairResult> results(static_cast<size_t>(n) * n);
  std::vector<double> all_1, all_n, all_lat;
  for (int src = 0; src < n; src++) {
    for (int dst = 0; dst < n; dst++) {
      if (src == dst) continue;
      Result<PairResult> r = bench_pair(c, a, buf, msg, *bytes, src, dst);
      if (!r.ok()) comm::abort_job(r.status().With(fmt::format("bench p2p, pair {} -> {}", src, dst)));
      results[src * n + dst] = *r;
      const double g1 = gbit_per_s(*bytes, r->seconds_1), gn = gbit_per_s(*bytes, r->seconds_n);
      all_1.push_back(g1);
      all_n.push_back(gn);
      all_lat.push_back(r->latency_s * 1e6);
      if (root && a.json) {
        std::string pct = a.link_gbps > 0 ? fmt::format(", \"pct_1\": {:.2f}, \"pct_n\": {:.2f}",
                                                        pct_of(g1, a.link_gbps), pct_of(gn, a.link_gbps))
                                          : "";
        std::printf("{\"src\": %d, \"dst\": %d, \"bytes\": %lld, \"gbps_1\": %.4f, \"gbps_n\": %.4f, "
                    "\"streams\": %d, \"latency_us\": %.3f, \"gbytes_per_s_1\": %.4f, \"gbytes_per_s_n\": %.4f%s}\n",
                    src, dst, static_cast<long long>(*bytes), g1, gn, a.streams, r->latency_s * 1e6, g1 / 8, gn / 8,
                    pct.c_str());
        std::fflush(stdout);
      }
    }
  }

  const Stats s1 = stats_of(all_1), sn = stats_of(all_n), sl = stats_of(all_lat);
  if (root && a.json) {
    std::string link = a.link_gbps > 0 ? fmt::format(", \"link_gbps\": {}, \"min_pct_1\": {:.2f}, \"mean_pct_1\": "
                                                     "{:.2f}, \"min_pct_n\": {:.2f}, \"mean_pct_n\": {:.2f}",
                                                     a.link_gbps, pct_of(s1.min, a.link_gbps),
                                                     pct_of(s1.mean, a.link_gbps), pct_of(sn.min, a.link_gbps),
                                                     pct_of(sn.mean, a.link_gbps))
                                       : "";
    std::printf("{\"summary\": \"p2p\", \"ranks\": %d, \"pairs\": %zu, \"bytes\": %lld, \"streams\": %d, "
                "\"min_gbps_1\": %.4f, \"mean_gbps_1\": %.4f, \"min_gbps_n\": %.4f, \"mean_gbps_n\": %.4f, "
                "\"min_latency_us\": %.3f, \"mean_latency_us\": %.3f, \"max_latency_us\": %.3f%s}\n",
                n, all_1.size(), static_cast<long long>(*bytes), a.streams, s1.min, s1.mean, sn.min, sn.mean, sl.min,
                sl.mean, sl.max, link.c_str());
  } else if (root) {
    // With a link speed, each bandwidth cell carries its % of the link.
    const bool link = a.link_gbps > 0;
    const int bw_width = link ? 18 : 10;
    auto bw_cell = [&](double seconds) {
      const double g = gbit_per_s(*bytes, seconds);
      return link ? fmt::format("{:.2f} ({:.1f}%)", g, pct_of(g, a.link_gbps)) : fmt::format("{:.2f}", g);
    };
    const std::string pct_title = link ? fmt::format(" [% of {} Gbit/s]", a.link_gbps) : "";
    print_matrix("bandwidth, 1 stream (Gbit/s)" + pct_title, n, bw_width,
                 [&](int i, int j) { return bw_cell(results[i * n + j].seconds_1); });
    print_matrix(fmt::format("bandwidth, {} streams (Gbit/s)", a.streams) + pct_title, n, bw_width,
                 [&](int i, int j) { return bw_cell(results[i * n + j].seconds_n); });
    print_matrix(fmt::format("latency (us), {} B, median half round trip", *lat_bytes), n, 10,
                 [&](int i, int j) { return fmt::format("{:.2f}", results[i * n + j].latency_s * 1e6); });
    std::printf("\n# 1 stream : min %.2f Gbit/s (%.3f GB/s), mean %.2f Gbit/s (%.3f GB/s)\n", s1.min, s1.min / 8,
                s1.mean, s1.mean / 8);
    std::printf("# %d streams: min %.2f Gbit/s (%.3f GB/s), mean %.2f Gbit/s (%.3f GB/s)\n", a.streams, sn.min,
                sn.min / 8, sn.mean, sn.mean / 8);
    std::printf("# latency  : min %.2f us, mean %.2f us, max %.2f us\n", sl.min, sl.mean, sl.max);
    if (link)
      std::printf("# vs the %g Gbit/s link: 1 stream min %.1f%% mean %.1f%%; %d streams min %.1f%% mean %.1f%%\n",
                  a.link_gbps, pct_of(s1.min, a.link_gbps), pct_of(s1.mean, a.link_gbps), a.streams,
                  pct_of(sn.min, a.link_gbps), pct_of(sn.mean, a.link_gbps));
  }
  std::fflush(stdout);
  world->reset();
  comm::mpi_finalize();
  return kExitOk;
}

}  // namespace

void add_bench_p2p_command(CLI::App& bench) {
  auto a = std::make_shared<P2pArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "p2p", "iperf-style bandwidth and latency between every pair of ranks, one pair at a time; run under mpirun");
  cmd->add_option("-b,--bytes", a->bytes, "bytes per transfer (K/M/G suffixes)");
  cmd->add_option("--streams", a->streams, "concurrent messages the transfer is split into, for the N-stream matrix");
  cmd->add_option("-n,--iters", a->iters, "timed transfers per pair and mode (the mean is reported)");
  cmd->add_option("-w,--warmup_iters", a->warmup, "untimed transfers first");
  cmd->add_option("--lat-size", a->lat_size, "ping-pong message size for latency, bytes (K/M/G suffixes)");
  cmd->add_option("--lat-iters", a->lat_iters, "timed round trips per pair (the median is reported)");
  cmd->add_option("--link-gbps", a->link_gbps, "link speed in Gbit/s: report bandwidth as % of it");
  cmd->add_flag("--json", a->json, "one JSON object per pair on stdout (and a summary object)");
  cmd->add_option("--timeout", a->timeout_s, "seconds any wait may take before the job ends with a timeout error");
  cmd->callback([a] { exit_code() = run_p2p_bench(*a); });
}

}  // namespace tessera::tools

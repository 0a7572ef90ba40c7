#include "train/tracing.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/agree.h"
#include "io/file.h"
#include "obs/trace.h"
#include "train/monitoring.h"

namespace tessera {

namespace {
// Ping-pong messages of the clock measurement, on the world communicator
// before anything else uses it.
constexpr int kTagClockPing = 7401;
constexpr int kTagClockPong = 7402;
}  // namespace

ClockOffset estimate_clock_offset(std::span<const ClockSample> samples) {
  ClockOffset best;
  int64_t best_rtt = std::numeric_limits<int64_t>::max();
  for (const ClockSample& s : samples) {
    const int64_t rtt = s.t3 - s.t1;
    if (rtt < 0 || rtt >= best_rtt) continue;
    best_rtt = rtt;
    // t2 - (t1 + t3) / 2 without overflowing the sum.
    best.offset_ns = s.t2 - (s.t1 + rtt / 2);
    best.rtt_ns = rtt;
    best.error_ns = (rtt + 1) / 2;
  }
  return best;
}

namespace {
// The kernel's id for this boot; empty when it cannot be read.
std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}
}  // namespace

Result<ClockOffset> measure_clock_offset(comm::Communicator& world, bool same_boot_shares_clock, int rounds) {
  const int rank = world.rank();
  // measure[r]: whether rank r pings rank 0. A rank that runs under the
  // same kernel as rank 0 (the same boot id: the same host, a container or
  // a network namespace on it) reads the same CLOCK_MONOTONIC: offset 0,
  // exactly.
  std::vector<int32_t> measure(static_cast<size_t>(world.size()), 0);
  char id0[64] = {};
  const std::string mine = boot_id();
  if (rank == 0) std::snprintf(id0, sizeof(id0), "%s", mine.c_str());
  RETURN_IF_ERROR(world.broadcast(id0, sizeof(id0), comm::ElemType::kU8, 0));
  const bool shared = same_boot_shares_clock && !mine.empty() && mine == id0;
  measure[static_cast<size_t>(rank)] = rank > 0 && !shared ? 1 : 0;
  RETURN_IF_ERROR(world.all_reduce(measure.data(), measure.data(), world.size(), comm::ElemType::kI32));
  std::vector<ClockSample> samples;
  for (int r = 1; r < world.size(); r++) {
    if (!measure[static_cast<size_t>(r)]) continue;
    for (int k = 0; k < rounds; k++) {
      if (rank == 0) {
        int64_t ping = 0;
        RETURN_IF_ERROR(world.recv(&ping, sizeof(ping), r, kTagClockPing));
        const int64_t t2 = obs::trace::now_ns();
        RETURN_IF_ERROR(world.send(&t2, sizeof(t2), r, kTagClockPong));
      } else if (rank == r) {
        ClockSample s;
        s.t1 = obs::trace::now_ns();
        RETURN_IF_ERROR(world.send(&s.t1, sizeof(s.t1), 0, kTagClockPing));
        RETURN_IF_ERROR(world.recv(&s.t2, sizeof(s.t2), 0, kTagClockPong));
        s.t3 = obs::trace::now_ns();
        samples.push_back(s);
      }
    }
  }
  return estimate_clock_offset(samples);
}

Result<std::unique_ptr<TraceSession>> start_trace(const TrainConfig& c, comm::Communicator& world,
                                                  const comm::MeshCoord& coord, std::FILE* out,
                                                  bool measure_every_rank) {
  if (c.trace.empty()) return std::unique_ptr<TraceSession>();
  // Every rank writes its own file (on its own host): each checks the
  // folder, and one rank's refusal is every rank's InvalidArgument, which
  // rank 0 reports in one line before the model is built.
  Status mine = io::check_writable_folder(c.trace).With("log.trace (--trace)");
  RETURN_IF_ERROR(comm::agree(world, mine.ok() ? mine : Status::InvalidArgument(mine.message())));
  const bool always = measure_every_rank;
  ASSIGN_OR_RETURN(ClockOffset clock, measure_clock_offset(world, !always));
  const bool measured = world.rank() > 0 && (always || clock.rtt_ns > 0);
  std::unique_ptr<TraceSession> s(new TraceSession);
  s->rank_ = world.rank();
  s->out_ = out;
  s->path_ = (std::filesystem::path(c.trace) / fmt::format("trace-rank-{}.json", world.rank())).string();
  std::string host;
  const obs::Labels labels = rank_labels(c, world.rank(), coord);
  for (const auto& [k, v] : labels.pairs())
    if (k == "host") host = v;
  s->process_name_ = fmt::format("rank {} (dp{} tp{} pp{}) {}", world.rank(), coord.dp, coord.tp, coord.pp, host);
  s->metadata_ = nlohmann::json{{"rank", world.rank()},
                                {"world_size", world.size()},
                                {"dp", coord.dp},
                                {"tp", coord.tp},
                                {"pp", coord.pp},
                                {"host", host},
                                {"clock", "steady (CLOCK_MONOTONIC), microseconds"},
                                {"clock_source", world.rank() == 0 ? "rank 0"
                                                 : measured        ? "ping-pong with rank 0"
                                                                   : "rank 0's host (same boot id)"},
                                {"clock_offset_us", static_cast<double>(clock.offset_ns) / 1e3},
                                {"clock_error_us", static_cast<double>(clock.error_ns) / 1e3},
                                {"clock_rtt_us", static_cast<double>(clock.rtt_ns) / 1e3}}
                     .dump();
  obs::trace::reset();
  obs::trace::set_thread_name("training");
  obs::trace::start();
  if (out) std::fprintf(out, "trace: recording to %s/trace-rank-*.json\n", c.trace.c_str());
  return s;
}

Status TraceSession::write() {
  if (written_) return Status::OK();
  written_ = true;
  obs::trace::stop();
  size_t events = 0;
  uint64_t dropped = 0;
  Status st =
      obs::trace::write_json(path_, obs::trace::ProcessInfo{rank_, process_name_, metadata_}, &events, &dropped);
  obs::trace::reset();
  if (st.ok() && dropped > 0)
    std::fprintf(stderr, "tessera: warning: trace: %s: %llu events dropped (more than %zu on one thread)\n",
                 path_.c_str(), static_cast<unsigned long long>(dropped), obs::trace::kMaxEventsPerThread);
  return st.With("trace");
}

TraceSession::~TraceSession() {
  if (written_) return;
  if (Status st = write(); !st.ok()) std::fprintf(stderr, "tessera: warning: %s\n", st.message().c_str());
  else if (out_) std::fprintf(out_, "trace: wrote %s (rank 0; each rank its own trace-rank-N.json)\n", path_.c_str());
}

}  // namespace tessera

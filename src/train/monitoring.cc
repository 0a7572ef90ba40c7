#include "train/monitoring.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "comm/agree.h"
#include "comm/mpi/local_device.h"
#include "core/host.h"
#include "io/file.h"

namespace tessera {

obs::Labels rank_labels(const TrainConfig& c, int rank, const comm::MeshCoord& coord) {
  return obs::Labels{{"rank", std::to_string(rank)},
                     {"dp", std::to_string(coord.dp)},
                     {"tp", std::to_string(coord.tp)},
                     {"pp", std::to_string(coord.pp)},
                     {"host", host_name()},
                     {"job", c.job.empty() ? "tessera" : c.job}};
}

Result<std::unique_ptr<obs::MetricsExporter>> start_metrics_exporter(const TrainConfig& c, comm::Communicator& world,
                                                                     obs::Registry& registry) {
  if (c.metrics_port == 0) return std::unique_ptr<obs::MetricsExporter>();
  // Ranks on one host take consecutive ports; each host starts at the same
  // one, so a Prometheus config lists host:P ... host:P+ranks_per_host-1.
  ASSIGN_OR_RETURN(comm::LocalRank local, comm::local_rank());
  const int port = c.metrics_port + local.rank;
  auto exporter = std::make_unique<obs::MetricsExporter>(registry);
  Status st = port > 65535
                  ? Status::InvalidArgument(fmt::format("log.metrics_port {} + local rank {} is beyond 65535",
                                                        c.metrics_port, local.rank))
                  : exporter->start(c.metrics_host, port);
  if (!st.ok() && port <= 65535)
    st = Status::InvalidArgument(fmt::format(
        "cannot serve metrics on {}:{} (the port is in use, or the address is not one of this host's); choose "
        "another --metrics-port (log.metrics_port; rank r uses it + its local rank) or 0 for none",
        c.metrics_host, port));
  RETURN_IF_ERROR(comm::agree(world, st));
  return exporter;
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

Status MetricsLog::open(const std::string& path) {
  if (path.empty()) return Status::OK();
  RETURN_IF_ERROR(io::check_openable_for_writing(path));  // creates the folder
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) return Status::IOError(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  return Status::OK();
}

void MetricsLog::write(const nlohmann::json& j) {
  if (!f_) return;
  std::fprintf(f_, "%s\n", j.dump().c_str());
  std::fflush(f_);
}

}  // namespace tessera

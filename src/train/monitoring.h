// Training's Prometheus side: the labels that say which rank a series comes
// from, and the exporter behind `tessera train --metrics-port`
// (docs/monitoring.md).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "comm/communicator.h"
#include "comm/mesh.h"
#include "obs/http/metrics_exporter.h"
#include "obs/metrics.h"
#include "train/config.h"

namespace tessera {

// {rank, dp, tp, pp, host, job}: the world rank, this rank's coordinates in
// the dp x tp x pp mesh, the host (TESSERA_HOST, which the emulated cluster
// sets, else the host name) and c.job ("tessera" when empty).
obs::Labels rank_labels(const TrainConfig& c, int rank, const comm::MeshCoord& coord);

// When c.metrics_port > 0, starts this rank's exporter of `registry` on
// c.metrics_host, port c.metrics_port + the rank's local rank; null when 0.
// Collective (every rank calls it with the same config): when any rank
// cannot bind, every rank gets the same InvalidArgument naming the first
// such rank and its address, which rank 0 reports in one line before
// training starts.
Result<std::unique_ptr<obs::MetricsExporter>> start_metrics_exporter(const TrainConfig& c, comm::Communicator& world,
                                                                     obs::Registry& registry);

// The log.metrics file: one JSON object a line, flushed per record (rank 0
// writes it). Without open() (no log.metrics), write() does nothing.
class MetricsLog {
 public:
  MetricsLog() = default;
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();
  // Creates the folder and truncates the file; IOError naming the path.
  Status open(const std::string& path);
  void write(const nlohmann::json& j);

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace tessera

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
#include "comm/traffic.h"
#include "obs/link.h"
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

// The network side of a training job's figures, the same for every model
// (GPT, DLRM): this rank's traffic since the last log() (comm/traffic.h)
// into the registry's tessera_train_comm_* series and into a JSONL record
// (comm_sent_bytes, comm_received_bytes, busbw_<op>_gbps, link_gbps).
// Not thread safe: the training thread owns it.
class CommMetrics {
 public:
  // Registers the series in `registry` (which must outlive this) and takes
  // the traffic so far as the baseline. `link`: the inter-host link.
  void start(obs::Registry& registry, const obs::LinkSpeed& link);
  // The traffic since start() or the last log().
  void log(nlohmann::json& record);
  // Takes the traffic so far as the baseline without logging it (the
  // first step's figures leave out an evaluation before it).
  void skip();

 private:
  obs::Registry* registry_ = nullptr;
  obs::Gauge* busbw_[comm::kOpKinds] = {};
  obs::Counter* bus_bytes_[comm::kOpKinds] = {};
  obs::Counter* busy_s_[comm::kOpKinds] = {};
  comm::Traffic::Snapshot prev_;
  // tessera_train_comm_bytes_total{peer, direction} per world rank (sent,
  // received), registered when the peer first has traffic; the totals over
  // peers at the last log(); the link's speed for the metrics file.
  std::vector<std::pair<obs::Counter*, obs::Counter*>> peer_bytes_;
  uint64_t sent_prev_ = 0, received_prev_ = 0;
  nlohmann::json link_gbps_;
};

}  // namespace tessera

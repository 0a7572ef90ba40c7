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

void CommMetrics::start(obs::Registry& registry, const obs::LinkSpeed& link) {
  registry_ = &registry;
  for (int k = 0; k < comm::kOpKinds; k++) {
    const obs::Labels op{{"op", comm::op_kind_name(static_cast<comm::OpKind>(k))}};
    busbw_[k] = &registry.gauge(
        "tessera_train_comm_bus_bandwidth_bytes_per_second",
        "Achieved bus bandwidth of this rank's operations of a kind in the last step where it ran (nccl-tests' busbw: "
        "bus bytes over the time operations of the kind were in flight)",
        op);
    bus_bytes_[k] = &registry.counter("tessera_train_comm_bus_bytes_total",
                                      "Bus bytes of this rank's operations by kind (nccl-tests' convention)", op);
    busy_s_[k] = &registry.counter("tessera_train_comm_busy_seconds_total",
                                   "Time at least one operation of the kind was in flight on this rank", op);
  }
  if (link.known())
    registry
        .gauge("tessera_train_link_speed_bytes_per_second",
               "Speed of the inter-host link (log.link_gbps, else the interface's sysfs speed)", {{"source", link.source}})
        .set(link.bytes_per_second);
  // To 6 significant digits: log.link_gbps is a float (0.2 is 0.200000003).
  link_gbps_ = link.known() ? nlohmann::json(std::stod(fmt::format("{:.6g}", link.bytes_per_second * 8 / 1e9)))
                            : nlohmann::json(nullptr);
  prev_ = comm::traffic().snapshot();
  sent_prev_ = received_prev_ = 0;
  for (const comm::Traffic::PeerBytes& p : prev_.peers) sent_prev_ += p.sent, received_prev_ += p.received;
}

void CommMetrics::skip() {
  prev_ = comm::traffic().snapshot();
  sent_prev_ = received_prev_ = 0;
  for (const comm::Traffic::PeerBytes& p : prev_.peers) sent_prev_ += p.sent, received_prev_ += p.received;
}

void CommMetrics::log(nlohmann::json& record) {
  const comm::Traffic::Snapshot now = comm::traffic().snapshot();
  const comm::TrafficDelta d = comm::traffic_delta(prev_, now);
  uint64_t sent = 0, received = 0;
  for (const comm::Traffic::PeerBytes& p : now.peers) {
    if (static_cast<size_t>(p.peer) >= peer_bytes_.size()) peer_bytes_.resize(p.peer + 1, {nullptr, nullptr});
    auto& [sent_total, received_total] = peer_bytes_[p.peer];
    if (sent_total == nullptr) {
      const std::string peer = std::to_string(p.peer);
      const char* help =
          "Bytes this rank sent to / received from a peer (world rank); collectives by their algorithm's model";
      sent_total = &registry_->counter("tessera_train_comm_bytes_total", help, {{"peer", peer}, {"direction", "sent"}});
      received_total =
          &registry_->counter("tessera_train_comm_bytes_total", help, {{"peer", peer}, {"direction", "received"}});
    }
    sent_total->advance_to(static_cast<double>(p.sent));
    received_total->advance_to(static_cast<double>(p.received));
    sent += p.sent;
    received += p.received;
  }
  record["comm_sent_bytes"] = sent - sent_prev_;
  record["comm_received_bytes"] = received - received_prev_;
  sent_prev_ = sent;
  received_prev_ = received;
  for (int k = 0; k < comm::kOpKinds; k++) {
    const size_t i = static_cast<size_t>(k);
    bus_bytes_[k]->advance_to(now.kinds[i].bus_bytes);
    busy_s_[k]->advance_to(now.kinds[i].busy_seconds);
    if (d.bus_bytes[i] <= 0 || d.busy_seconds[i] <= 0) continue;
    busbw_[k]->set(d.busbw[i]);
    record[fmt::format("busbw_{}_gbps", comm::op_kind_name(static_cast<comm::OpKind>(k)))] = d.busbw[i] * 8 / 1e9;
  }
  record["link_gbps"] = link_gbps_;
  prev_ = now;
}

}  // namespace tessera

#include "plan/cluster.h"

#include <fmt/format.h>

#include <filesystem>

#include <toml++/toml.h>

namespace tessera::plan {

std::string Cluster::str() const {
  std::string between =
      nodes > 1 ? fmt::format(", {} between ({:.1f} GB/s per node)", inter.kind, inter.busbw / 1e9) : std::string();
  return fmt::format("{} x {} ({} rank{} per node), {} inside{}, ${:.2f}/node-hour", nodes, node.name, ranks_per_node,
                     ranks_per_node == 1 ? "" : "s", intra.kind, between, price_per_hour);
}

Result<Cluster> load_cluster(const std::string& path) {
  namespace fs = std::filesystem;
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    if (!fs::exists(path)) return Status::NotFound(fmt::format("cluster file {} does not exist", path));
    return Status::InvalidArgument(fmt::format("cluster file {}: line {}: {}", path, e.source().begin.line,
                                               std::string(e.description())));
  }
  auto missing = [&](const char* key, const char* what) {
    return Status::InvalidArgument(fmt::format("cluster file {}: missing {} ({})", path, key, what));
  };
  Cluster c;
  c.file = path;
  c.name = t["name"].value_or(fs::path(path).stem().string());
  const auto* node = t["node"].as_table();
  if (node == nullptr) return missing("[node]", "the node type, count and price");
  const auto type = (*node)["type"].value<std::string>();
  const auto profile = (*node)["profile"].value<std::string>();
  if (type && profile)
    return Status::InvalidArgument(fmt::format("cluster file {}: node.type and node.profile are exclusive", path));
  if (type) {
    ASSIGN_OR_RETURN(c.node, catalogue_entry(*type));
  } else if (profile) {
    fs::path p(*profile);
    if (p.is_relative()) p = fs::path(path).parent_path() / p;
    ASSIGN_OR_RETURN(c.node, node_from_profile(p.string()));
  } else {
    return missing("node.type or node.profile", "a catalogue name such as \"A100-80GB\", or a doctor profile JSON");
  }
  auto count = (*node)["count"].value<int64_t>();
  if (!count) return missing("node.count", "how many nodes");
  if (*count < 1 || *count > 100000)
    return Status::InvalidArgument(fmt::format("cluster file {}: node.count must be in [1, 100000], got {}", path, *count));
  c.nodes = static_cast<int>(*count);
  c.ranks_per_node = static_cast<int>((*node)["devices"].value_or(int64_t{c.node.kind == DeviceKind::kGpu ? c.node.devices : 1}));
  if (c.ranks_per_node < 1 || c.ranks_per_node > 1024)
    return Status::InvalidArgument(fmt::format("cluster file {}: node.devices must be in [1, 1024]", path));
  auto price = (*node)["price_per_hour"].value<double>();
  if (!price) return missing("node.price_per_hour", "USD per node-hour; 0 for owned hardware");
  if (*price < 0) return Status::InvalidArgument(fmt::format("cluster file {}: node.price_per_hour is negative", path));
  c.price_per_hour = *price;
  c.shared_host = (*node)["shared_host"].value_or(false);
  c.threads_per_rank = static_cast<int>((*node)["threads_per_rank"].value_or(int64_t{0}));
  if (c.threads_per_rank < 0 || c.threads_per_rank > 4096)
    return Status::InvalidArgument(fmt::format("cluster file {}: node.threads_per_rank must be in [0, 4096]", path));

  const auto* net = t["network"].as_table();
  c.intra = c.node.intra;
  if (net != nullptr) {
    if (auto intra = (*net)["intra"].value<std::string>()) {
      auto l = intra_link(*intra, c.node);
      if (!l.ok()) return Status::InvalidArgument(fmt::format("cluster file {}: network.intra: {}", path, l.status().message()));
      // A profile's measured shared-memory figure stays when "shm" is named.
      if (!(*intra == "shm" && c.node.intra.kind == "shm")) c.intra = *l;
    }
  }
  c.inter.kind = "none";
  if (c.nodes > 1) {
    if (net == nullptr) return missing("[network]", "how the nodes are connected: inter and gbps");
    auto inter = (*net)["inter"].value<std::string>();
    if (!inter) return missing("network.inter", "\"ethernet\" or \"infiniband\"");
    if (*inter != "ethernet" && *inter != "infiniband")
      return Status::InvalidArgument(
          fmt::format("cluster file {}: network.inter must be \"ethernet\" or \"infiniband\", got \"{}\"", path, *inter));
    auto gbps = (*net)["gbps"].value<double>();
    if (!gbps) return missing("network.gbps", "link rate per NIC in Gbit/s");
    if (*gbps <= 0 || *gbps > 3200)
      return Status::InvalidArgument(fmt::format("cluster file {}: network.gbps must be in (0, 3200], got {}", path, *gbps));
    const int nics = static_cast<int>((*net)["nics"].value_or(int64_t{1}));
    if (nics < 1) return Status::InvalidArgument(fmt::format("cluster file {}: network.nics must be at least 1", path));
    const bool ib = *inter == "infiniband";
    // Fraction of the line rate a collective's bus bandwidth reaches:
    // NCCL over IB ~0.92 (nccl-tests on HDR/NDR), over TCP sockets ~0.8.
    const double eff = (*net)["efficiency"].value_or(ib ? 0.92 : 0.8);
    c.inter.kind = fmt::format("{} {:g} Gbit/s x{}", *inter, *gbps, nics);
    c.inter.busbw = *gbps / 8.0 * 1e9 * nics * eff;
    c.inter.alpha = (*net)["latency_us"].value_or(ib ? 5.0 : 30.0) * 1e-6;
    c.inter.note = fmt::format("{:g} Gbit/s x {} NIC(s) at {:.0f}% efficiency, {:.0f} us per step", *gbps, nics,
                               eff * 100, c.inter.alpha * 1e6);
  }
  return c;
}

}  // namespace tessera::plan

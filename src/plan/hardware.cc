#include "plan/hardware.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

namespace tessera::plan {

namespace {

const char* kCatalogueText =
#include "plan/catalogue.inc"
    ;

const toml::table& catalogue_table() {
  static const toml::table t = toml::parse(kCatalogueText);
  return t;
}

NodeType entry_from_toml(const std::string& name, const toml::table& e) {
  NodeType n;
  n.name = name;
  n.source = e["source"].value_or(std::string());
  n.kind = e["kind"].value_or(std::string("gpu")) == "cpu" ? DeviceKind::kCpu : DeviceKind::kGpu;
  n.devices = e["devices"].value_or(1);
  n.cores = e["cores"].value_or(0);
  if (const auto* p = e["peak_tflops"].as_table())
    for (const auto& [k, v] : *p) n.peak[std::string(k.str())] = v.value_or(0.0) * 1e12;
  n.memory = e["memory_gb"].value_or(0.0) * 1e9;
  n.mem_bw = e["mem_bw_gbs"].value_or(0.0) * 1e9;
  n.mem_efficiency = e["mem_efficiency"].value_or(1.0);
  n.e_max[""] = e["e_max"].value_or(0.8);
  if (auto v = e["e_max_bf16"].value<double>()) n.e_max["bf16"] = *v;
  n.s_half = e["s_half"].value_or(128.0);
  // GPU kernels move bf16 activations; Tessera's CPU kernels fp32 ones.
  n.act_bytes = n.kind == DeviceKind::kGpu ? 2 : 4;
  n.backward_factor["fp32"] = 0.9;
  n.backward_factor["bf16"] = n.kind == DeviceKind::kGpu ? 0.9 : 0.72;
  n.backward_factor["tf32"] = 0.9;
  n.lookup_efficiency = e["lookup_efficiency"].value_or(n.kind == DeviceKind::kGpu ? 0.6 : 0.55);
  n.interaction_efficiency = e["interaction_efficiency"].value_or(n.kind == DeviceKind::kGpu ? 0.0 : 0.08);
  auto link = intra_link(e["intra"].value_or(std::string("shm")), n);
  if (link.ok()) n.intra = *link;
  return n;
}

}  // namespace

double NodeType::a2a_busbw_at(double bytes) const {
  double best = a2a.busbw, dist = 1e300;
  for (const auto& [b, bw] : a2a_points) {
    const double d = std::abs(std::log2(std::max(bytes, 1.0) / b));
    if (d < dist) dist = d, best = bw;
  }
  return best;
}

double NodeType::mfu_peak_of(const std::string& dtype) const {
  auto it = mfu_peak.find(dtype);
  return it != mfu_peak.end() && it->second > 0 ? it->second : peak_of(dtype);
}

double NodeType::peak_of(const std::string& dtype) const {
  auto it = peak.find(dtype);
  if (it != peak.end() && it->second > 0) return it->second;
  it = peak.find("fp32");
  return it == peak.end() ? 0.0 : it->second;
}

double NodeType::gemm_efficiency(const std::string& dtype, double m, double n, double k) const {
  auto it = gemm.find(dtype);
  if (it == gemm.end() || it->second.empty()) it = gemm.find("fp32");
  if (it != gemm.end() && !it->second.empty()) {
    // Inverse-distance weighting in log space over the measured shapes: an
    // exact shape gets its own figure, one between shapes a blend of the
    // nearest, one beyond them the nearest's.
    double wsum = 0, esum = 0;
    for (const auto& p : it->second) {
      const double d2 = std::pow(std::log2(m / p.m), 2) + std::pow(std::log2(n / p.n), 2) +
                        std::pow(std::log2(k / p.k), 2);
      if (d2 < 1e-9) return p.efficiency;
      const double w = 1.0 / (d2 * d2);
      wsum += w;
      esum += w * p.efficiency;
    }
    return esum / wsum;
  }
  auto e = e_max.find(dtype);
  const double emax = e != e_max.end() ? e->second : (e_max.count("") ? e_max.at("") : 0.8);
  const double s = std::cbrt(m * n * k);
  return emax * s / (s + s_half);
}

std::vector<std::string> catalogue_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : catalogue_table()) names.emplace_back(k.str());
  return names;
}

Result<NodeType> catalogue_entry(const std::string& name) {
  const auto* e = catalogue_table()[name].as_table();
  if (e == nullptr) {
    std::string known;
    for (const auto& n : catalogue_names()) known += (known.empty() ? "" : ", ") + n;
    return Status::NotFound(fmt::format("unknown node type '{}' (catalogue: {})", name, known));
  }
  return entry_from_toml(name, *e);
}

Result<LinkModel> intra_link(const std::string& kind, const NodeType& node) {
  LinkModel l;
  l.kind = kind;
  // busbw per device as nccl-tests' all_reduce_perf reports it at large sizes.
  if (kind == "nvlink3") {
    l.busbw = 230e9, l.alpha = 8e-6, l.note = "A100 NVLink 3 (300 GB/s per direction), nccl-tests busbw ~230 GB/s";
  } else if (kind == "nvlink4") {
    l.busbw = 360e9, l.alpha = 8e-6, l.note = "H100 NVLink 4 (450 GB/s per direction), nccl-tests busbw ~360 GB/s";
  } else if (kind == "pcie4") {
    l.busbw = 20e9, l.alpha = 10e-6, l.note = "PCIe 4.0 x16 (32 GB/s per direction), busbw ~20 GB/s through the host";
  } else if (kind == "pcie5") {
    l.busbw = 40e9, l.alpha = 10e-6, l.note = "PCIe 5.0 x16 (64 GB/s per direction), busbw ~40 GB/s through the host";
  } else if (kind == "shm") {
    l.busbw = 0.25 * node.mem_bw * node.mem_efficiency, l.alpha = 5e-6,
    l.note = "shared memory: a quarter of the memory bandwidth (each byte copied in and out of a shared segment)";
  } else {
    return Status::InvalidArgument(
        fmt::format("unknown link inside a node '{}' (nvlink3, nvlink4, pcie4, pcie5, shm)", kind));
  }
  return l;
}

Result<NodeType> node_from_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(fmt::format("cannot read profile {}", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return Status::Corruption(fmt::format("profile {} is not JSON: {}", path, e.what()));
  }
  if (j.value("schema", std::string()) != "tessera.profile")
    return Status::InvalidArgument(fmt::format("{} is not a tessera profile (schema is not \"tessera.profile\")", path));
  if (j.value("version", 0) != 1)
    return Status::InvalidArgument(fmt::format("{}: profile version {} is not supported (this tessera reads version 1)", path,
                                               j.value("version", 0)));
  if (!j.contains("machine") || !j["machine"].is_object() || !j.contains("figures") || !j["figures"].is_array())
    return Status::InvalidArgument(fmt::format("profile {} lacks 'machine' or 'figures'", path));
  const auto& m = j["machine"];
  NodeType n;
  n.name = m.value("hostname", std::string("profiled"));
  n.source = fmt::format("profile {} ({}, {})", path, m.value("cpu_model", std::string("?")), j.value("created", std::string("?")));
  n.kind = DeviceKind::kCpu;
  n.cores = m.value("cores", 0);
  if (n.cores <= 0) return Status::InvalidArgument(fmt::format("profile {}: machine.cores is missing", path));
  n.memory = m.value("memory_bytes", 0.0);
  std::map<std::string, double> fig;
  for (const auto& f : j["figures"])
    if (f.contains("name") && f.contains("value") && f["value"].is_number())
      fig[f["name"].get<std::string>()] = f["value"].get<double>();
  if (m.contains("theoretical_peak_gflops") && m["theoretical_peak_gflops"].is_object())
    for (const auto& [k, v] : m["theoretical_peak_gflops"].items())
      if (v.is_number()) n.peak[k] = n.mfu_peak[k] = v.get<double>() * 1e9;
  // The measured GEMM peak prices compute: GEMM efficiencies are rates
  // against it. MFU stays against the theoretical peak (issue 17 item 3).
  for (const char* dt : {"fp32", "bf16"}) {
    auto p = fig.find(fmt::format("cpu.gemm.{}.peak", dt));
    if (p != fig.end() && p->second > 0) n.peak[dt] = p->second * 1e9;
  }
  if (n.peak_of("fp32") <= 0)
    return Status::InvalidArgument(
        fmt::format("profile {}: neither cpu.gemm.fp32.peak nor machine.theoretical_peak_gflops.fp32", path));
  // Figures are rates of all the cores (tessera doctor), or of
  // machine.figure_threads threads (scripts/plan-profile.sh measures one
  // thread on a loaded machine and says 1): those are scaled to the cores.
  const int threads = std::clamp(m.value("figure_threads", n.cores), 1, n.cores);
  const double scale = static_cast<double>(n.cores) / threads;
  for (auto& [dt, p] : n.peak) p *= (fig.count(fmt::format("cpu.gemm.{}.peak", dt)) ? scale : 1.0);
  for (const auto& [name, value] : fig) {
    char dt[8];
    double mm, nn, kk;
    if (std::sscanf(name.c_str(), "cpu.gemm.%7[a-z0-9].%lfx%lfx%lf", dt, &mm, &nn, &kk) == 4 && value > 0)
      n.gemm[dt].push_back({mm, nn, kk, value * 1e9 * scale / n.peak_of(dt)});
  }
  auto triad = fig.find("cpu.mem.triad");
  n.mem_bw = triad != fig.end() ? triad->second * 1e9 * scale : 10e9;
  if (auto read = fig.find("cpu.mem.read"); read != fig.end() && read->second > 0) n.read_bw = read->second * 1e9 * scale;
  n.mem_efficiency = 1.0;  // measured
  n.e_max[""] = 0.8;
  n.s_half = 96;
  n.act_bytes = 4;
  n.backward_factor["fp32"] = 0.9;
  n.backward_factor["bf16"] = 0.72;
  n.intra = *intra_link("shm", n);
  n.interaction_efficiency = 0.08;  // Tessera's CPU kernel (docs/planner.md, "DLRM")
  // A measured all-reduce among the profile's ranks on this host replaces
  // the shared-memory default: the largest size's busbw, and alpha from the
  // smallest size's time over its 2(n-1) ring steps.
  const int ranks = m.value("comm_ranks", 0), hosts = m.value("comm_hosts", 0);
  if (ranks > 1 && hosts <= 1) {
    double best_bytes = 0, small_bytes = 1e300;
    for (const auto& [name, value] : fig) {
      double b;
      if (std::sscanf(name.c_str(), "comm.allreduce.busbw.%lf", &b) == 1 && b > best_bytes && value > 0)
        best_bytes = b, n.intra.busbw = value * 1e9;
      if (std::sscanf(name.c_str(), "comm.allreduce.time_us.%lf", &b) == 1 && b < small_bytes && value > 0)
        small_bytes = b, n.intra.alpha = value * 1e-6 / (2.0 * (ranks - 1));
    }
    if (best_bytes > 0) n.intra.note = fmt::format("measured all-reduce busbw over {} ranks (profile)", ranks);
    // The same for an all-to-all (tessera bench alltoall): every size's busbw
    // (it varies with the message size far more than an all-reduce's), alpha
    // from the smallest size's time over its n-1 steps.
    double a2a_small = 1e300;
    for (const auto& [name, value] : fig) {
      double b;
      if (std::sscanf(name.c_str(), "comm.alltoall.busbw.%lf", &b) == 1 && value > 0) n.a2a_points.push_back({b, value * 1e9});
      if (std::sscanf(name.c_str(), "comm.alltoall.time_us.%lf", &b) == 1 && b < a2a_small && value > 0)
        a2a_small = b, n.a2a.alpha = value * 1e-6 / (ranks - 1);
    }
    if (!n.a2a_points.empty()) {
      std::sort(n.a2a_points.begin(), n.a2a_points.end());
      n.a2a.kind = "shm";
      n.a2a.busbw = n.a2a_points.back().second;
      n.a2a.note = fmt::format("measured all-to-all busbw over {} ranks (profile)", ranks);
    }
  }
  // Embedding-bag lookups (tessera bench dlrm-ops: rows read + ids + pooled
  // output per second, the same threads as the triad figure).
  if (auto eb = fig.find("cpu.mem.embedding_bag"); eb != fig.end() && triad != fig.end() && triad->second > 0)
    n.lookup_efficiency = std::min(1.0, eb->second / triad->second);
  return n;
}

}  // namespace tessera::plan

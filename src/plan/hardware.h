// What a node can do, for the planner: peak FLOP/s by dtype, GEMM efficiency
// by matrix shape, memory and its bandwidth, per device. A node type comes
// either from the built-in catalogue (catalogue.inc: datasheet figures with
// their sources and a documented efficiency curve) or from a machine profile
// that `tessera doctor --save` wrote (docs/formats/profile.md: measured GEMM
// rates at many shapes, STREAM triad, collective bus bandwidths).
// Units: FLOP/s, bytes, bytes/s, seconds.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::plan {

enum class DeviceKind { kCpu, kGpu };

// One measured GEMM: C(M,N) = A(M,K) B(K,N) at `efficiency` of the peak.
struct GemmPoint {
  double m = 0, n = 0, k = 0, efficiency = 0;
};

// A collective's bus bandwidth (nccl-tests' busbw) and start-up latency on a
// link: time = alpha x steps + factor x bytes / busbw.
struct LinkModel {
  std::string kind;    // "nvlink", "pcie", "shm", "ethernet", "infiniband", ...
  double busbw = 0;    // bytes/s per device (intra) or per node (inter)
  double alpha = 0;    // seconds per algorithm step
  std::string note;    // how the figure was obtained
};

struct NodeType {
  std::string name;        // "A100-80GB", or the profile's host name
  std::string source;      // datasheet URL/name, or "profile FILE"
  DeviceKind kind = DeviceKind::kCpu;
  int devices = 1;         // GPUs per node; CPU: 1 (the ranks share the node)
  int cores = 0;           // CPU cores per node
  std::map<std::string, double> peak;  // per device, FLOP/s, by dtype "fp32", "bf16"
  // MFU's denominator where it differs from `peak`: a profile's theoretical
  // peak (perf/profile.h; the trainer and bench train divide by it too),
  // while its compute is priced from the measured GEMM peak above.
  std::map<std::string, double> mfu_peak;
  double memory = 0;       // bytes per device (CPU: the node)
  double mem_bw = 0;       // bytes/s per device (CPU: the node, STREAM triad)
  // What a decode step's reads reach (plan/serve.h): a profile's cpu.mem.read
  // (tessera doctor: every thread streaming a buffer past the last-level
  // cache, reads only); 0 where it is not known (mem_bw is used instead).
  double read_bw = 0;
  // Efficiency against shape: measured points per dtype (a profile), else
  // the curve e_max * s / (s + s_half), s = cbrt(M*N*K).
  std::map<std::string, std::vector<GemmPoint>> gemm;
  std::map<std::string, double> e_max;  // by dtype; "" is the default
  double s_half = 128;
  // Backward matmuls (dinp and dW) run at this fraction of the forward's
  // efficiency (oneDNN's bf16 backward converts and transposes into scratch).
  std::map<std::string, double> backward_factor;
  // Bytes per activation element that the elementwise kernels move (Tessera
  // keeps fp32 activations on the CPU; GPU kernels here are bf16).
  double act_bytes = 4;
  double mem_efficiency = 1.0;  // fraction of mem_bw the elementwise kernels reach
  LinkModel intra;         // the measured or typical link inside the node
  // DLRM (plan/dlrm.h). Random reads of embedding rows (256 B at D = 64)
  // reach this fraction of mem_bw x mem_efficiency: a profile's measured
  // cpu.mem.embedding_bag over its triad, else the catalogue's figure.
  double lookup_efficiency = 0.55;
  // DLRM's dot interaction (F x F dots of D floats per sample) as a fraction
  // of the fp32 peak: Tessera's CPU kernel, measured (0.08); 0: the GEMM
  // curve at (F, F, D), for GPUs (a batched GEMM).
  double interaction_efficiency = 0;
  // A measured all-to-all among ranks on this node (a profile's
  // comm.alltoall.*): busbw by bytes per rank, alpha; busbw 0 when none.
  LinkModel a2a;
  std::vector<std::pair<double, double>> a2a_points;  // (bytes per rank, busbw), ascending bytes
  // busbw at the measured size nearest (in log) to `bytes`; a2a.busbw when none.
  double a2a_busbw_at(double bytes) const;

  double peak_of(const std::string& dtype) const;  // falls back to fp32
  double mfu_peak_of(const std::string& dtype) const;  // mfu_peak, else peak_of
  // Efficiency (0, 1] of one GEMM of that shape and dtype on one device.
  double gemm_efficiency(const std::string& dtype, double m, double n, double k) const;
};

// The catalogue: names and entries (catalogue.inc).
Result<NodeType> catalogue_entry(const std::string& name);
std::vector<std::string> catalogue_names();
// The link types a cluster file may name inside a node, with their typical
// busbw per device (nvlink3, nvlink4, pcie4, pcie5, shm).
Result<LinkModel> intra_link(const std::string& kind, const NodeType& node);

// A node type from a doctor profile (docs/formats/profile.md). Needs
// machine.cores and at least cpu.gemm.<dtype>.peak or theoretical peaks;
// errors name the file and the missing field.
Result<NodeType> node_from_profile(const std::string& path);

}  // namespace tessera::plan

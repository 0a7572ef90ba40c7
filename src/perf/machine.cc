#include "perf/machine.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/nccl_factory.h"
#include "core/cpu_features.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/onednn_info.h"
#include "perf/gpu_checks.h"

namespace tessera::perf {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) i++;
  return s.substr(i);
}

// The value of "key : value" lines of /proc/cpuinfo, one per processor.
std::vector<std::string> cpuinfo_values(const std::string& cpuinfo, const std::string& key) {
  std::vector<std::string> out;
  std::istringstream in(cpuinfo);
  std::string line;
  while (std::getline(in, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (trim(line.substr(0, colon)) == key) out.push_back(trim(line.substr(colon + 1)));
  }
  return out;
}

}  // namespace

PeakTable flops_per_cycle(const IsaCaps& isa) {
  PeakTable t;
  if (isa.avx512f && isa.fma) {
    t.fp32_per_cycle = 64;
    t.fp32_basis = "AVX-512 FMA: 2 units x 16 fp32 x 2";
  } else if (isa.avx2 && isa.fma) {
    t.fp32_per_cycle = 32;
    t.fp32_basis = "AVX2 FMA: 2 units x 8 fp32 x 2";
  } else {
    t.fp32_per_cycle = 8;
    t.fp32_basis = "SSE: 4 fp32 x (1 add + 1 mul)";
  }
  if (isa.amx_bf16) {
    t.bf16_per_cycle = 1024;
    t.bf16_basis = "AMX-BF16 TMUL: 1024 per cycle (Intel's figure)";
  } else if (isa.avx512_bf16) {
    t.bf16_per_cycle = 128;
    t.bf16_basis = "AVX512-BF16 vdpbf16ps: 2 units x 16 lanes x 2 pairs x 2";
  } else {
    t.bf16_per_cycle = t.fp32_per_cycle;
    t.bf16_basis = "no bf16 instructions: computed in fp32 (" + t.fp32_basis + ")";
  }
  if (isa.amx_int8) {
    t.int8_per_cycle = 2048;
    t.int8_basis = "AMX-INT8 TMUL: 2048 per cycle (Intel's figure)";
  } else if (isa.avx512_vnni) {
    t.int8_per_cycle = 256;
    t.int8_basis = "AVX512-VNNI vpdpbusd: 2 units x 16 lanes x 4 x 2";
  } else if (isa.avx_vnni) {
    t.int8_per_cycle = 128;
    t.int8_basis = "AVX-VNNI vpdpbusd: 2 units x 8 lanes x 4 x 2";
  } else {
    t.int8_per_cycle = 2 * t.fp32_per_cycle;
    t.int8_basis = "no VNNI: 16-bit multiply-adds, taken as 2 x the fp32 rate";
  }
  return t;
}

TheoreticalPeak theoretical_peak(const IsaCaps& isa, int cores, double clock_ghz) {
  const PeakTable t = flops_per_cycle(isa);
  const double cycles = std::max(cores, 0) * std::max(clock_ghz, 0.0);  // G cycles per second
  return {t.fp32_per_cycle * cycles, t.bf16_per_cycle * cycles, t.int8_per_cycle * cycles};
}

double gpu_datasheet_peak_tflops(const std::string& device_name) {
  // Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from NVIDIA's data
  // sheets. Longer names first: "H100 PCIe" before "H100".
  static const std::pair<const char*, double> kTable[] = {
      {"H200", 989.0},  {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.0}, {"GH200", 989.0},
      {"B200", 2250.0}, {"A100", 312.0},      {"A10G", 70.0},      {"A10", 125.0},  {"L40S", 362.0},
      {"L40", 181.0},   {"L4", 121.0},        {"A6000", 155.0},    {"V100", 125.0},
  };
  for (const auto& [key, tflops] : kTable)
    if (device_name.find(key) != std::string::npos) return tflops;
  return 0.0;
}

double measure_clock_ghz() {
#if defined(__x86_64__)
  // Many short samples: on a busy machine (or a VM whose vCPU the host
  // deschedules) a long one is nearly always interrupted; a ~70 us one often
  // is not, and the best of 300 is the clock.
  constexpr int64_t kLoops = 1 << 14;  // x 16 adds: 262144 cycles, ~70 us at 4 GHz
  double best = 0;
  for (int rep = 0; rep < 300; rep++) {
    uint64_t x = 0, one = 1;
    int64_t n = kLoops;
    const auto t0 = std::chrono::steady_clock::now();
    // Register-register adds: a renamer can fold add-immediate chains (Golden
    // Cove does), not these. The loop counter runs on another port.
    asm volatile(
        "1:\n\t"
        "add %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\t"
        "add %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\t"
        "add %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\t"
        "add %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\tadd %[one], %[x]\n\t"
        "dec %[n]\n\t"
        "jnz 1b\n\t"
        : [x] "+r"(x), [n] "+r"(n)
        : [one] "r"(one)
        : "cc");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 16.0 * kLoops / s / 1e9);
  }
  return best;
#else
  return 0.0;
#endif
}

double clock_ghz_from(const std::string& cpufreq_max_khz, double measured_ghz, const std::string& brand,
                      const std::string& cpuinfo, std::string* source) {
  const double khz = std::atof(cpufreq_max_khz.c_str());
  if (khz > 0) {
    *source = "cpufreq cpuinfo_max_freq";
    return khz / 1e6;
  }
  if (measured_ghz > 0) {
    *source = "measured (dependent adds, one core)";
    return measured_ghz;
  }
  if (size_t at = brand.find('@'); at != std::string::npos) {
    const double ghz = std::atof(brand.c_str() + at + 1);
    if (ghz > 0 && brand.find("GHz", at) != std::string::npos) {
      *source = "brand string";
      return ghz;
    }
  }
  for (const std::string& mhz : cpuinfo_values(cpuinfo, "cpu MHz")) {
    const double v = std::atof(mhz.c_str());
    if (v > 0) {
      *source = "/proc/cpuinfo cpu MHz (current clock)";
      return v / 1e3;
    }
  }
  *source = "unknown";
  return 0.0;
}

MachineInfo detect_machine(bool probe_device) {
  MachineInfo m;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) m.hostname = host;
  const CpuFeatures& f = cpu_features();
  const std::string cpuinfo = read_text("/proc/cpuinfo");
  m.cpu_model = f.brand;
  if (m.cpu_model.empty()) {
    auto names = cpuinfo_values(cpuinfo, "model name");
    if (!names.empty()) m.cpu_model = names[0];
  }
  m.threads = f.logical_cores;
  // Physical cores: distinct (physical id, core id) pairs.
  auto socket_ids = cpuinfo_values(cpuinfo, "physical id");
  auto core_ids = cpuinfo_values(cpuinfo, "core id");
  std::set<std::pair<std::string, std::string>> cores;
  std::set<std::string> sockets(socket_ids.begin(), socket_ids.end());
  for (size_t i = 0; i < std::min(socket_ids.size(), core_ids.size()); i++) cores.insert({socket_ids[i], core_ids[i]});
  m.cores = cores.empty() ? m.threads : static_cast<int>(cores.size());
  m.sockets = sockets.empty() ? 1 : static_cast<int>(sockets.size());

  m.caps.fma = f.fma;
  m.caps.avx2 = f.avx2;
  m.caps.avx512f = f.avx512f;
  m.caps.avx512_bf16 = f.avx512_bf16;
  m.caps.amx_bf16 = f.amx_bf16;
  m.caps.avx512_vnni = f.avx512_vnni;
  m.caps.avx_vnni = f.avx_vnni;
  m.caps.amx_int8 = f.amx_int8;
  std::istringstream isa(f.summary());
  for (std::string w; isa >> w;) m.isa.push_back(w);

  const std::string cpufreq = read_text("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  m.clock_ghz = clock_ghz_from(cpufreq, cpufreq.empty() ? measure_clock_ghz() : 0.0, m.cpu_model, cpuinfo,
                               &m.clock_source);
  m.peak = theoretical_peak(m.caps, m.cores, m.clock_ghz);

  std::istringstream meminfo(read_text("/proc/meminfo"));
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemTotal:", 0) == 0) m.memory_bytes = std::atoll(line.c_str() + 9) * 1024;

  std::istringstream osr(read_text("/etc/os-release"));
  for (std::string line; std::getline(osr, line);)
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      m.os = line.substr(12);
      m.os.erase(std::remove(m.os.begin(), m.os.end(), '"'), m.os.end());
    }
  struct utsname u;
  if (uname(&u) == 0) m.os += (m.os.empty() ? "" : ", ") + std::string(u.sysname) + " " + u.release;

  m.onednn = onednn_version();
  const cpu::Int8KernelInfo k = cpu::int8_kernel_info();
  m.int8_kernel = k.summary;
  m.int8_exact = k.exact;
  m.isa_cap = f.cap;
  m.mpi = comm::mpi_library_version();
  if (probe_device) m.device = probe_gpu();
  if (m.device) {
    if (comm::nccl_compiled()) m.device->nccl = comm::nccl_version();
    m.device->datasheet_bf16_tflops = gpu_datasheet_peak_tflops(m.device->name);
  }
  return m;
}

}  // namespace tessera::perf

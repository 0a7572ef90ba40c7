// What machine this is, for a doctor profile (docs/formats/profile.md): the
// CPU, its clock, memory, library versions, the attached GPU, and the
// theoretical peak FLOP/s that MFU is measured against when no profile says
// better (docs/doctor.md has the table and its assumptions).
// Thread safety: detect_machine() reads /proc and /sys and may be called from
// any thread; the rest are pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::perf {

// The ISA features that decide FLOPs per cycle (from cpuid and /proc/cpuinfo).
struct IsaCaps {
  bool fma = false, avx2 = false, avx512f = false;
  bool avx512_bf16 = false, amx_bf16 = false;
  bool avx512_vnni = false, avx_vnni = false, amx_int8 = false;
};

// Per core per cycle, and the machine's peak: cores x per-cycle x clock.
struct PeakTable {
  double fp32_per_cycle = 0, bf16_per_cycle = 0, int8_per_cycle = 0;  // per core
  std::string fp32_basis, bf16_basis, int8_basis;                     // "AVX-512 FMA: 2 units x 16 x 2"
};
PeakTable flops_per_cycle(const IsaCaps& isa);

struct TheoreticalPeak {
  double fp32 = 0, bf16 = 0, int8 = 0;  // GFLOP/s (int8: GOP/s), the whole machine
};
TheoreticalPeak theoretical_peak(const IsaCaps& isa, int cores, double clock_ghz);

// The datasheet dense (no sparsity) bf16 tensor-core peak of a GPU by its
// name ("NVIDIA H100 80GB HBM3"), TFLOP/s; 0 when the name is not in the table.
double gpu_datasheet_peak_tflops(const std::string& device_name);

struct DeviceInfo {
  std::string name, driver, cuda, nccl, cudnn;
  int64_t memory_bytes = 0;
  double datasheet_bf16_tflops = 0;  // 0: unknown
};

struct MachineInfo {
  std::string hostname, cpu_model, os, onednn, mpi;
  // The INT8 matmul's kernel and whether it is exact here (kernels/cpu/int8_kernel.h).
  std::string int8_kernel;
  bool int8_exact = true;
  std::string isa_cap;  // "DNNL_MAX_CPU_ISA=AVX2" when that capped the features below
  int cores = 1;    // physical cores (hyperthreads share the FMA units)
  int threads = 1;  // logical CPUs
  int sockets = 1;
  std::vector<std::string> isa;  // "avx2", "avx512f", "avx512_bf16", "amx_bf16", ...
  IsaCaps caps;
  double clock_ghz = 0;
  std::string clock_source;  // "cpufreq max", "brand string", "/proc/cpuinfo cpu MHz"
  int64_t memory_bytes = 0;
  TheoreticalPeak peak;
  std::optional<DeviceInfo> device;  // absent: no GPU (or no CUDA backend)
};

// Detects this machine. The GPU is looked up only when `probe_device` (it
// initialises the CUDA runtime) and CUDA is compiled in.
MachineInfo detect_machine(bool probe_device);

// The clock one core runs at, measured: a chain of dependent register adds
// (one cycle each on every x86 core since the Pentium 4) timed on the
// calling thread, best of 300 samples of ~70 us (a preempted sample is
// slower, never faster). Boost included: what a VM without cpufreq cannot
// tell. GHz; ~25 ms.
double measure_clock_ghz();

// The clock for the theoretical peak, in this order: cpufreq's
// cpuinfo_max_freq (kHz), the measured clock (measured_ghz, 0: none), the
// "@ 2.60GHz" of the brand string (a base clock), /proc/cpuinfo's "cpu MHz"
// (the current clock). GHz, and which one it came from in *source; 0 when
// none is known.
double clock_ghz_from(const std::string& cpufreq_max_khz, double measured_ghz, const std::string& brand,
                      const std::string& cpuinfo, std::string* source);

}  // namespace tessera::perf

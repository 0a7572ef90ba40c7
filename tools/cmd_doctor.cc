// tessera doctor: measure this machine (src/perf/doctor.h), print a table,
// optionally save the profile and compare it with a baseline (exit 1 on a
// regression, one "REGRESSED name: ..." line each on stderr). Under mpirun
// or `tessera launch` with more than one rank, every rank takes part in the
// communication checks, then rank 0 alone runs the CPU and GPU checks of its
// host, prints and writes the profile. docs/doctor.md.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "comm/mpi/mpi_communicator.h"
#include "perf/doctor.h"
#include "perf/profile.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct DoctorArgs {
  bool quick = false;
  std::string save, baseline, tolerance = "10%", dir = ".";
  std::string compare;  // a saved profile to show (and compare) instead of measuring
};

std::string gib(int64_t bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

void print_machine(const perf::Profile& p) {
  const perf::MachineInfo& m = p.machine;
  std::string isa;
  for (const std::string& f : m.isa) isa += (isa.empty() ? "" : " ") + f;
  const perf::PeakTable t = perf::flops_per_cycle(m.caps);
  std::printf("# machine: %s (%s), %d core(s), %d thread(s), %d socket(s), %.2f GHz (%s), %s\n", m.cpu_model.c_str(),
              m.hostname.c_str(), m.cores, m.threads, m.sockets, m.clock_ghz, m.clock_source.c_str(),
              gib(m.memory_bytes).c_str());
  std::printf("# isa: %s%s\n", isa.c_str(), m.isa_cap.empty() ? "" : (" (capped: " + m.isa_cap + ")").c_str());
  if (!m.int8_kernel.empty())
    std::printf("# int8 matmul: %s%s\n", m.int8_kernel.c_str(),
                m.int8_exact ? "" : "; WRONG results on this CPU: the INT8 tier refuses to start");
  std::printf("# theoretical peak: fp32 %.1f GFLOP/s (%s), bf16 %.1f GFLOP/s (%s), int8 %.1f GOP/s (%s); "
              "per core per cycle x %d cores x %.2f GHz\n",
              m.peak.fp32, t.fp32_basis.c_str(), m.peak.bf16, t.bf16_basis.c_str(), m.peak.int8, t.int8_basis.c_str(),
              m.cores, m.clock_ghz);
  std::printf("# software: %s; oneDNN %s; %s; tessera %s\n", m.os.c_str(), m.onednn.c_str(), m.mpi.c_str(),
              p.tessera.c_str());
  if (m.device)
    std::printf("# device: %s, %s, driver %s, CUDA %s%s\n", m.device->name.c_str(), gib(m.device->memory_bytes).c_str(),
                m.device->driver.c_str(), m.device->cuda.c_str(),
                m.device->nccl.empty() ? "" : (", NCCL " + m.device->nccl).c_str());
  else
    std::printf("# device: none\n");
  if (p.comm_ranks > 0) std::printf("# communication: %d ranks on %d host(s)\n", p.comm_ranks, p.comm_hosts);
}

// The share of the theoretical peak, for GEMM and thread-scaling rows.
std::string of_peak(const perf::Profile& p, const perf::Figure& f) {
  const perf::TheoreticalPeak& t = p.machine.peak;
  double peak = 0;
  if (f.name.rfind("cpu.gemm.fp32.", 0) == 0) peak = t.fp32;
  else if (f.name.rfind("cpu.gemm.bf16.", 0) == 0) peak = t.bf16;
  else if (f.name.rfind("cpu.gemm.int8.", 0) == 0) peak = t.int8;
  else if (f.name.rfind("cpu.threads.", 0) == 0) {
    const int n = std::atoi(f.name.c_str() + 12);
    peak = p.machine.cores > 0 ? t.fp32 * n / p.machine.cores : 0;
  }
  if (f.name == "gpu.gemm.bf16.peak" && p.machine.device && p.machine.device->datasheet_bf16_tflops > 0)
    return fmt::format("{:.0f}% of the datasheet peak", f.value / (p.machine.device->datasheet_bf16_tflops * 1e3) * 100);
  return peak > 0 ? fmt::format("{:.0f}% of theoretical", f.value / peak * 100) : "";
}

std::string num(double v) { return std::fabs(v) >= 10 ? fmt::format("{:.1f}", v) : fmt::format("{:.3g}", v); }

// Runs the checks into *p; true when this process reports them. Under MPI,
// the ranks other than 0 return false after the communication checks.
Result<bool> measure(const DoctorArgs& a, const perf::DoctorOptions& o, perf::Profile* out) {
  perf::Profile& p = *out;
  p.created = perf::utc_now_iso8601();
  p.tessera = TESSERA_VERSION;
  p.quick = a.quick;
  if (comm::launched_under_mpi()) {
    comm::CommOptions options;
    options.timeout = std::chrono::seconds(1800);  // rank 0's checks may take a while; the others wait in finalize
    auto world = comm::world_communicator(options);
    if (!world.ok()) return world.status();
    if ((*world)->size() > 1) {
      if (Status st = perf::run_comm_checks(**world, o, &p); !st.ok())
        comm::abort_job(st.With("doctor communication checks"));
    }
    const int rank = (*world)->rank();
    world->reset();
    comm::mpi_finalize();
    if (rank != 0) return false;
  }
  p.machine = perf::detect_machine(/*probe_device=*/true);
  RETURN_IF_ERROR(perf::run_local_checks(o, &p));
  return true;
}

int run_doctor(const DoctorArgs& a) {
  const bool root = launcher_rank() == 0;
  auto tolerance = perf::parse_tolerance(a.tolerance);
  if (!tolerance.ok()) return usage_error(tolerance.status().message());
  std::optional<perf::Profile> baseline;
  if (!a.baseline.empty()) {
    Result<perf::Profile> b = perf::load_profile(a.baseline);
    if (!b.ok()) return root ? fail(b.status()) : kExitError;
    baseline = std::move(b).value();
  }
  std::optional<perf::Profile> saved;
  if (!a.compare.empty()) {
    Result<perf::Profile> c = perf::load_profile(a.compare);
    if (!c.ok()) return fail(c.status());
    saved = std::move(c).value();
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(a.dir, ec) || access(a.dir.c_str(), W_OK) != 0)
    return root ? fail(Status::InvalidArgument(fmt::format("--dir {}: not a writable directory", a.dir))) : kExitError;
  if (!a.save.empty() && root) {
    const std::filesystem::path parent = std::filesystem::path(a.save).parent_path();
    if (!parent.empty() && (!std::filesystem::is_directory(parent, ec) || access(parent.c_str(), W_OK) != 0))
      return fail(Status::InvalidArgument(fmt::format("--save {}: {} is not a writable directory", a.save,
                                                      parent.string())));
  }

  perf::DoctorOptions o;
  o.quick = a.quick;
  const char* tiny = std::getenv("TESSERA_DOCTOR_TINY");  // tests: the smallest sizes
  o.tiny = tiny && std::string(tiny) == "1";
  o.disk_dir = a.dir;
  o.progress = [](const std::string& line) {
    std::fprintf(stderr, "doctor: %s\n", line.c_str());
    std::fflush(stderr);
  };

  perf::Profile p;
  if (saved) {
    p = std::move(*saved);
  } else {
    Result<bool> reporter = measure(a, o, &p);
    if (!reporter.ok()) return fail(reporter.status());
    if (!*reporter) return kExitOk;
  }
  print_machine(p);
  std::vector<perf::Comparison> cmp;
  if (baseline) {
    cmp = perf::compare_profiles(p, *baseline, *tolerance);
    std::printf("%-40s %12s  %-8s %12s %8s  %-9s\n", "name", "value", "unit", "baseline", "change", "status");
  } else {
    std::printf("%-40s %12s  %-8s  %s\n", "name", "value", "unit", "note");
  }
  int regressions = 0;
  for (size_t i = 0; i < p.figures.size(); i++) {
    const perf::Figure& f = p.figures[i];
    if (!baseline) {
      std::printf("%-40s %12s  %-8s  %s\n", f.name.c_str(), num(f.value).c_str(), f.unit.c_str(),
                  of_peak(p, f).c_str());
      continue;
    }
    const perf::Comparison& c = cmp[i];
    const bool known = c.verdict != perf::Verdict::kNew;
    regressions += c.verdict == perf::Verdict::kRegressed;
    std::printf("%-40s %12s  %-8s %12s %8s  %-9s\n", f.name.c_str(), num(f.value).c_str(), f.unit.c_str(),
                known ? num(c.baseline).c_str() : "-",
                known ? fmt::format("{:+.1f}%", c.change * 100).c_str() : "-",
                c.verdict == perf::Verdict::kPass ? "PASS" : c.verdict == perf::Verdict::kRegressed ? "REGRESSED" : "new");
  }
  std::fflush(stdout);
  if (!a.save.empty()) {
    if (Status st = perf::save_profile(p, a.save); !st.ok()) return fail(st);
    std::fprintf(stderr, "doctor: profile saved to %s\n", a.save.c_str());
  }
  for (const perf::Comparison& c : cmp)
    if (c.verdict == perf::Verdict::kRegressed) std::fprintf(stderr, "%s\n", perf::regression_line(c, *tolerance).c_str());
  if (baseline)
    std::fprintf(stderr, "doctor: %d figure(s) regressed against %s (tolerance %s)\n", regressions,
                 a.baseline.c_str(), a.tolerance.c_str());
  return regressions > 0 ? kExitError : kExitOk;
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto a = std::make_shared<DoctorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Measure this machine (GEMM, memory, allocation, threads, disk, GPU, communication under mpirun) "
                "and compare with a baseline profile");
  cmd->add_flag("--quick", a->quick, "fewer sizes and repetitions (under 2 minutes on 2 cores)");
  cmd->add_option("--save", a->save, "write the profile JSON here (docs/formats/profile.md)");
  cmd->add_option("--baseline", a->baseline, "a saved profile: mark each figure PASS or REGRESSED, exit 1 on any");
  cmd->add_option("--tolerance", a->tolerance, "how much worse than the baseline still passes (default 10%)");
  cmd->add_option("--compare", a->compare,
                  "show this saved profile (and compare it with --baseline) instead of measuring");
  cmd->add_option("--dir", a->dir, "directory the disk check writes its temporary file in (default .)");
  cmd->callback([a] { exit_code() = run_doctor(*a); });
}

}  // namespace tessera::tools

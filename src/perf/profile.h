// The machine profile `tessera doctor` writes and the planner, `bench train`
// and the trainer read (docs/formats/profile.md: schema "tessera.profile",
// version 1): the machine and a flat list of named figures, each with its
// unit and whether higher or lower is better. Also the baseline comparison
// (PASS / REGRESSED within a tolerance). Plain values; no I/O but the two
// file functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "perf/machine.h"

namespace tessera::perf {

inline constexpr const char* kProfileSchema = "tessera.profile";
inline constexpr int kProfileVersion = 1;

enum class Better { kHigher, kLower };

struct Figure {
  std::string name;  // "cpu.gemm.fp32.1024x1024x1024"
  double value = 0;
  std::string unit;  // "GFLOP/s", "GB/s", "ns", "us", "MB/s", ...
  Better better = Better::kHigher;
};

struct Profile {
  std::string created;  // ISO 8601 UTC
  std::string tessera;  // version
  bool quick = false;
  MachineInfo machine;
  int comm_ranks = 0, comm_hosts = 0;  // 0: no communication figures
  std::vector<Figure> figures;

  const Figure* find(const std::string& name) const;
};

// JSON text (2-space indent) and back. parse_profile checks the schema name,
// the version and every field's presence and type; errors name the field
// ("figures[3].value: expected a number").
std::string profile_to_json(const Profile& p);
Result<Profile> parse_profile(const std::string& text);
// The file: "<path>: cannot read ...", "<path>: not JSON ...", "<path>: ...".
Result<Profile> load_profile(const std::string& path);
Status save_profile(const Profile& p, const std::string& path);

// "10%", "10", "0.5%": a fraction (0.10). Error for anything else or < 0.
Result<double> parse_tolerance(const std::string& text);

enum class Verdict { kPass, kRegressed, kNew };  // kNew: not in the baseline

struct Comparison {
  std::string name, unit;
  double value = 0, baseline = 0;
  double change = 0;  // (value - baseline) / baseline, signed; 0 without a baseline
  Verdict verdict = Verdict::kNew;
};

// Each figure of `current` against the one of the same name in `baseline`:
// REGRESSED when it is worse than the baseline by more than `tolerance`
// (a fraction) in the figure's direction, PASS otherwise (better is always
// PASS). A baseline figure of 0 passes unless the current one is worse.
Comparison compare_figure(const Figure& current, const Figure* baseline, double tolerance);
std::vector<Comparison> compare_profiles(const Profile& current, const Profile& baseline, double tolerance);

// "REGRESSED cpu.mem.triad: 20.1 GB/s, baseline 45.0 (-55%, tolerance 10%)"
std::string regression_line(const Comparison& c, double tolerance);

// The MFU denominator and the GEMM peak beside it (item 3 of issue 17):
// against the profile's measured GEMM peak for the dtype when a profile is
// given, "GEMM efficiency" = achieved / that peak, and MFU against the
// profile's theoretical peak; without one, the theoretical peak of this
// machine. Never a peak measured in the same run.
struct PeakReference {
  double peak_gflops = 0;       // MFU denominator, per process (rank)
  double gemm_peak_gflops = 0;  // measured GEMM peak from the profile; 0: none
  std::string source;           // "profile docs/profiles/x.json" or "theoretical (cores x ...)"
};
// dtype "fp32" | "bf16". `ranks_per_host` divides the machine's peak between
// the ranks sharing it (the profile describes one host).
PeakReference cpu_peak_reference(const std::optional<Profile>& profile, const MachineInfo& here,
                                 const std::string& dtype, int ranks_per_host);
// A GPU rank: the profile's device datasheet peak (or gpu.gemm.bf16.peak as
// the GEMM peak); without one, the datasheet peak of `device_name`, else
// fallback_tflops.
PeakReference gpu_peak_reference(const std::optional<Profile>& profile, const std::string& device_name,
                                 double fallback_tflops);

// Where a profile comes from: `flag` (a --profile PATH or a config key) when
// not empty, else $TESSERA_PROFILE, else none (""). find_profile reads it;
// errors name the path.
std::string profile_path(const std::string& flag);
Result<std::optional<Profile>> find_profile(const std::string& flag);

}  // namespace tessera::perf

// The doctor's comparison (direction, tolerance), the profile's schema
// checks, and the theoretical peak table (perf/profile.h, perf/machine.h).
#include "perf/profile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "perf/machine.h"

namespace tessera::perf {
namespace {

Figure fig(const char* name, double v, Better b) { return {name, v, "GB/s", b}; }

TEST(Compare, HigherIsBetterRegressesOnlyWhenLowerBeyondTolerance) {
  const Figure base = fig("cpu.mem.triad", 45.0, Better::kHigher);
  EXPECT_EQ(compare_figure(fig("cpu.mem.triad", 45.0, Better::kHigher), &base, 0.10).verdict, Verdict::kPass);
  EXPECT_EQ(compare_figure(fig("cpu.mem.triad", 41.0, Better::kHigher), &base, 0.10).verdict, Verdict::kPass);
  EXPECT_EQ(compare_figure(fig("cpu.mem.triad", 40.0, Better::kHigher), &base, 0.10).verdict, Verdict::kRegressed);
  EXPECT_EQ(compare_figure(fig("cpu.mem.triad", 90.0, Better::kHigher), &base, 0.10).verdict, Verdict::kPass);
  const Comparison c = compare_figure(fig("cpu.mem.triad", 20.1, Better::kHigher), &base, 0.10);
  EXPECT_EQ(c.verdict, Verdict::kRegressed);
  EXPECT_NEAR(c.change, -0.5533, 1e-3);
}

TEST(Compare, LowerIsBetterRegressesWhenHigherBeyondTolerance) {
  const Figure base = fig("cpu.alloc.page_fault_ns", 100.0, Better::kLower);
  EXPECT_EQ(compare_figure(fig("x", 109.0, Better::kLower), &base, 0.10).verdict, Verdict::kPass);
  EXPECT_EQ(compare_figure(fig("x", 111.0, Better::kLower), &base, 0.10).verdict, Verdict::kRegressed);
  EXPECT_EQ(compare_figure(fig("x", 10.0, Better::kLower), &base, 0.10).verdict, Verdict::kPass);
}

TEST(Compare, ExactlyAtToleranceAndZeroTolerance) {
  const Figure base = fig("a", 100.0, Better::kHigher);
  EXPECT_EQ(compare_figure(fig("a", 90.0, Better::kHigher), &base, 0.10).verdict, Verdict::kPass);
  EXPECT_EQ(compare_figure(fig("a", 100.0, Better::kHigher), &base, 0.0).verdict, Verdict::kPass);
  EXPECT_EQ(compare_figure(fig("a", 99.9, Better::kHigher), &base, 0.0).verdict, Verdict::kRegressed);
}

TEST(Compare, NotInBaselineIsNew) {
  EXPECT_EQ(compare_figure(fig("a", 1.0, Better::kHigher), nullptr, 0.1).verdict, Verdict::kNew);
}

TEST(Compare, ZeroBaselinePassesUnlessWorse) {
  const Figure base = fig("a", 0.0, Better::kLower);
  EXPECT_EQ(compare_figure(fig("a", 0.0, Better::kLower), &base, 0.1).verdict, Verdict::kPass);
  EXPECT_EQ(compare_figure(fig("a", 1.0, Better::kLower), &base, 0.1).verdict, Verdict::kRegressed);
}

TEST(Compare, RegressionLineNamesFigureValueBaselineChangeAndTolerance) {
  const Figure base = fig("cpu.mem.triad", 45.0, Better::kHigher);
  const Comparison c = compare_figure(fig("cpu.mem.triad", 20.1, Better::kHigher), &base, 0.10);
  EXPECT_EQ(regression_line(c, 0.10), "REGRESSED cpu.mem.triad: 20.1 GB/s, baseline 45.0 (-55%, tolerance 10%)");
}

TEST(Compare, RegressionLineOfALowerIsBetterFigure) {
  const Figure base{"cpu.alloc.page_fault_ns", 0.5, "us", Better::kLower};
  const Comparison c = compare_figure({"cpu.alloc.page_fault_ns", 0.625, "us", Better::kLower}, &base, 0.05);
  EXPECT_EQ(regression_line(c, 0.05), "REGRESSED cpu.alloc.page_fault_ns: 0.625 us, baseline 0.5 (+25%, tolerance 5%)");
}

TEST(Tolerance, ParsesPercentages) {
  EXPECT_DOUBLE_EQ(*parse_tolerance("10%"), 0.10);
  EXPECT_DOUBLE_EQ(*parse_tolerance("10"), 0.10);
  EXPECT_DOUBLE_EQ(*parse_tolerance("0.5%"), 0.005);
  EXPECT_DOUBLE_EQ(*parse_tolerance("0"), 0.0);
  for (const char* bad : {"", "%", "-5%", "ten", "10%%", "1e9", "nan"}) EXPECT_FALSE(parse_tolerance(bad).ok()) << bad;
}

TEST(TheoreticalPeak, Avx512FmaIs64Fp32FlopsPerCyclePerCore) {
  IsaCaps isa;
  isa.fma = isa.avx2 = isa.avx512f = true;
  const TheoreticalPeak p = theoretical_peak(isa, 2, 2.6);
  EXPECT_DOUBLE_EQ(p.fp32, 2 * 64 * 2.6);
  EXPECT_DOUBLE_EQ(p.bf16, p.fp32);      // no bf16 instructions: computed in fp32
  EXPECT_DOUBLE_EQ(p.int8, 2 * p.fp32);  // no VNNI
  isa.avx512_bf16 = isa.avx512_vnni = true;
  const TheoreticalPeak q = theoretical_peak(isa, 2, 2.6);
  EXPECT_DOUBLE_EQ(q.bf16, 2 * 128 * 2.6);
  EXPECT_DOUBLE_EQ(q.int8, 2 * 256 * 2.6);
}

TEST(TheoreticalPeak, Avx2AmxAndBaseline) {
  IsaCaps avx2;
  avx2.fma = avx2.avx2 = true;
  EXPECT_DOUBLE_EQ(theoretical_peak(avx2, 8, 3.0).fp32, 8 * 32 * 3.0);
  IsaCaps amx = avx2;
  amx.avx512f = amx.amx_bf16 = amx.amx_int8 = true;
  EXPECT_DOUBLE_EQ(theoretical_peak(amx, 56, 2.0).bf16, 56 * 1024 * 2.0);
  EXPECT_DOUBLE_EQ(theoretical_peak(amx, 56, 2.0).int8, 56 * 2048 * 2.0);
  EXPECT_DOUBLE_EQ(theoretical_peak(IsaCaps{}, 1, 1.0).fp32, 8.0);
  EXPECT_DOUBLE_EQ(theoretical_peak(avx2, 4, 0.0).fp32, 0.0);  // unknown clock: no peak
}

TEST(Clock, CpufreqThenMeasuredThenBrandThenCpuinfo) {
  std::string src;
  EXPECT_DOUBLE_EQ(clock_ghz_from("3700000\n", 3.4, "Intel Xeon @ 2.60GHz", "cpu MHz : 1200.0\n", &src), 3.7);
  EXPECT_EQ(src, "cpufreq cpuinfo_max_freq");
  EXPECT_DOUBLE_EQ(clock_ghz_from("", 3.4, "Intel Xeon @ 2.60GHz", "cpu MHz : 1200.0\n", &src), 3.4);
  EXPECT_EQ(src, "measured (dependent adds, one core)");
  EXPECT_DOUBLE_EQ(clock_ghz_from("", 0, "Intel(R) Xeon(R) Platinum 8480 CPU @ 2.00GHz", "cpu MHz : 1200.0\n", &src),
                   2.0);
  EXPECT_EQ(src, "brand string");
  EXPECT_DOUBLE_EQ(clock_ghz_from("", 0, "AMD EPYC", "processor : 0\ncpu MHz\t\t: 2596.122\n", &src), 2.596122);
  EXPECT_DOUBLE_EQ(clock_ghz_from("", 0, "", "", &src), 0.0);
}

TEST(Clock, MeasuredClockIsPlausible) {
  const double ghz = measure_clock_ghz();
  EXPECT_GT(ghz, 0.3);
  EXPECT_LT(ghz, 7.0);
}

TEST(GpuPeak, DatasheetTable) {
  EXPECT_DOUBLE_EQ(gpu_datasheet_peak_tflops("NVIDIA H100 80GB HBM3, 132 SMs"), 989.0);
  EXPECT_DOUBLE_EQ(gpu_datasheet_peak_tflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(gpu_datasheet_peak_tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_DOUBLE_EQ(gpu_datasheet_peak_tflops("Some Future GPU"), 0.0);
}

Profile sample() {
  Profile p;
  p.created = "2026-12-01T01:00:00Z";
  p.tessera = "0.1.0";
  p.machine.cpu_model = "Test CPU";
  p.machine.isa = {"avx2", "fma"};
  p.machine.peak = {100, 100, 200};
  p.machine.int8_kernel = "avx2 (vpmaddubsw on |x| and sign(x)*w, exact)";
  p.machine.isa_cap = "DNNL_MAX_CPU_ISA=AVX2";
  p.figures = {{"cpu.gemm.fp32.peak", 80, "GFLOP/s", Better::kHigher},
               {"cpu.alloc.page_fault_ns", 250, "ns", Better::kLower}};
  return p;
}

TEST(ProfileJson, RoundTrips) {
  Result<Profile> back = parse_profile(profile_to_json(sample()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->figures.size(), 2u);
  EXPECT_EQ(back->figures[1].better, Better::kLower);
  EXPECT_EQ(back->machine.cpu_model, "Test CPU");
  EXPECT_DOUBLE_EQ(back->machine.peak.int8, 200);
  EXPECT_FALSE(back->machine.device.has_value());
  // The INT8 kernel and the ISA cap (issue #27), and the capabilities the
  // peak's basis is derived from, back from the names.
  EXPECT_EQ(back->machine.int8_kernel, "avx2 (vpmaddubsw on |x| and sign(x)*w, exact)");
  EXPECT_TRUE(back->machine.int8_exact);
  EXPECT_EQ(back->machine.isa_cap, "DNNL_MAX_CPU_ISA=AVX2");
  EXPECT_TRUE(back->machine.caps.avx2 && back->machine.caps.fma);
  EXPECT_FALSE(back->machine.caps.avx512f || back->machine.caps.avx512_vnni);
  IsaCaps avx2;
  avx2.avx2 = avx2.fma = true;
  EXPECT_EQ(flops_per_cycle(back->machine.caps).fp32_basis, flops_per_cycle(avx2).fp32_basis);
}

// A profile written before #27 has no INT8 kernel fields: it still reads.
TEST(ProfileJson, ReadsProfilesWithoutTheInt8KernelFields) {
  auto j = nlohmann::json::parse(profile_to_json(sample()));
  j["machine"].erase("int8_kernel");
  j["machine"].erase("int8_exact");
  j["machine"].erase("isa_cap");
  Result<Profile> back = parse_profile(j.dump());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->machine.int8_kernel, "");
}

TEST(ProfileJson, RefusesWrongSchemaVersionAndTypes) {
  std::string good = profile_to_json(sample());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return parse_profile(s);
  };
  EXPECT_NE(with("\"tessera.profile\"", "\"other\"").status().message().find("schema"), std::string::npos);
  EXPECT_NE(with("\"version\": 1", "\"version\": 2").status().message().find("version 2"), std::string::npos);
  EXPECT_NE(with("\"value\": 80.0", "\"value\": \"80\"").status().message().find("figures[0].value"),
            std::string::npos);
  EXPECT_NE(with("\"better\": \"lower\"", "\"better\": \"down\"").status().message().find("figures[1].better"),
            std::string::npos);
  EXPECT_FALSE(parse_profile("{").ok());
  EXPECT_FALSE(parse_profile("[]").ok());
}

TEST(PeakReference, ProfileTheoreticalForMfuAndMeasuredGemmForEfficiency) {
  MachineInfo here;
  here.cores = 2;
  here.clock_ghz = 2.0;
  here.caps.fma = here.caps.avx2 = true;
  here.peak = theoretical_peak(here.caps, 2, 2.0);
  const PeakReference none = cpu_peak_reference(std::nullopt, here, "fp32", 1);
  EXPECT_DOUBLE_EQ(none.peak_gflops, 128.0);
  EXPECT_DOUBLE_EQ(none.gemm_peak_gflops, 0.0);
  const PeakReference with = cpu_peak_reference(sample(), here, "fp32", 2);
  EXPECT_DOUBLE_EQ(with.peak_gflops, 50.0);       // the profile's theoretical, shared by 2 ranks
  EXPECT_DOUBLE_EQ(with.gemm_peak_gflops, 40.0);  // its measured GEMM peak, shared
}

}  // namespace
}  // namespace tessera::perf

// tessera bench gemm | train: the oneDNN matmul peak, and training-step
// throughput with MFU against the machine's peak: the theoretical peak
// recorded in a doctor profile (--profile, or $TESSERA_PROFILE), else this
// machine's theoretical peak (CPU: cores x FLOP/cycle x clock; --backend
// cuda: the device's datasheet dense bf16 peak, or --peak-tflops). Never a
// peak measured in the same run (a loaded machine could print an MFU above
// 1). With a profile, "gemm_efficiency" is achieved / its measured GEMM peak.
// The measurements are in src/perf (cpu_checks.h, train_bench.h).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/onednn_info.h"
#include "perf/cpu_checks.h"
#include "perf/flops.h"
#include "perf/gpu_checks.h"
#include "perf/machine.h"
#include "perf/profile.h"
#include "perf/train_bench.h"
#include "runtime/cuda_device.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

MatmulPrecision parse_dtype(const std::string& s) {
  return s == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
}

struct GemmArgs {
  std::string dtype = "fp32";
  std::vector<int> sizes = {1024, 2048, 4096};
  int iters = 5;
};

int run_gemm(const GemmArgs& a) {
  MatmulPrecision prec = parse_dtype(a.dtype);
  double peak = 0.0;
  for (int n : a.sizes) {
    double g = perf::measure_matmul_gflops(n, prec, a.iters);
    peak = std::max(peak, g);
    std::printf("{\"m\": %d, \"n\": %d, \"k\": %d, \"dtype\": \"%s\", \"gflops\": %.1f}\n", n, n, n,
                a.dtype.c_str(), g);
  }
  std::printf("{\"dtype\": \"%s\", \"peak_gflops\": %.1f, \"isa\": \"%s\"}\n", a.dtype.c_str(), peak,
              onednn_isa().c_str());
  return kExitOk;
}

struct TrainArgs {
  GPTConfig model{12, 12, 768, 50257, 0};
  std::string arch = "gpt2";  // or "llama": RMSNorm, rotary, SwiGLU, no biases, untied head
  int batch = 8, seq = 256, steps = 5, warmup = 1;
  std::string dtype = "fp32";
  std::string profile;  // --profile (else $TESSERA_PROFILE)
  double peak_gflops = 0;  // --backend cpu: a stated peak overriding the profile's or the theoretical one
  std::string backend = "cpu";
  double peak_tflops = 0;  // --backend cuda: 0 = the datasheet peak of the device (else kCudaPeakTflops)
};

int run_train_bench(TrainArgs a) {
  const bool cuda = a.backend == "cuda";
  if (a.model.context <= 0) a.model.context = a.seq;
  if (a.arch == "llama") {
    a.model.norm = Norm::kRMSNorm;
    a.model.positions = Positions::kRope;
    a.model.mlp = Mlp::kSwiGLU;
    a.model.bias = a.model.qkv_bias = a.model.tied_head = false;
  } else if (a.model.kv_heads > 0 || a.model.mlp_hidden > 0) {
    return fail(Status::InvalidArgument("--kv-heads and --mlp-hidden are for --arch llama"));
  }
  if (Status st = a.model.validate(); !st.ok()) return fail(st);
  if (a.seq > a.model.context)
    return fail(Status::InvalidArgument(fmt::format("--seq {} exceeds --context {}", a.seq, a.model.context)));
  Result<std::optional<perf::Profile>> profile = perf::find_profile(a.profile);
  if (!profile.ok()) return fail(profile.status());
  perf::PeakReference ref;
  std::string device_name;
  if (cuda) {
    if (Status st = backend_available(Backend::kCUDA); !st.ok()) return fail(st);
    Result<int> device = cuda::select_device(0);
    if (!device.ok()) return fail(device.status());
    device_name = cuda::device_summary(*device);
    ref = perf::gpu_peak_reference(*profile, device_name, kCudaPeakTflops);
    if (a.peak_tflops > 0) {
      ref.peak_gflops = a.peak_tflops * 1e3;
      ref.source = "--peak-tflops";
    }
  } else {
    ref = perf::cpu_peak_reference(*profile, perf::detect_machine(false), a.dtype, 1);
    if (a.peak_gflops > 0) {
      ref.peak_gflops = a.peak_gflops;
      ref.source = "--peak-gflops";
    }
  }
  if (ref.peak_gflops <= 0)
    return fail(Status::InvalidArgument("no peak to measure MFU against: this CPU's clock is unknown; pass --profile"));

  perf::TrainBenchConfig c;
  c.model = a.model;
  c.batch = a.batch;
  c.seq = a.seq;
  c.steps = a.steps;
  c.warmup = a.warmup;
  c.prec = parse_dtype(a.dtype);
  c.backend = cuda ? Backend::kCUDA : Backend::kCPUProfiled;
  Result<perf::TrainBenchResult> r = perf::run_train_bench(c, stderr);
  if (!r.ok()) return fail(r.status());
  const double achieved = r->flops_per_step / r->step_s / 1e9;  // GFLOP/s
  const std::string gemm_eff =
      ref.gemm_peak_gflops > 0 ? fmt::format("{:.3f}", achieved / ref.gemm_peak_gflops) : "null";
  const std::string gemm_peak = ref.gemm_peak_gflops > 0 ? fmt::format("{:.1f}", ref.gemm_peak_gflops) : "null";
  auto ms = [&](double s) { return s * 1e3; };
  std::string out = fmt::format(
      "{{\"backend\": \"{}\", \"step_ms\": {:.2f}, \"tokens_per_s\": {:.1f}, \"mfu\": {:.4f}, "
      "\"gemm_efficiency\": {}, \"peak_gflops\": {:.1f}, \"peak_source\": \"{}\", \"gemm_peak_gflops\": {}, "
      "\"achieved_gflops\": {:.1f}, \"dtype\": \"{}\", \"model\": \"{}\", \"params\": {}, \"batch\": {}, \"seq\": {}, "
      "\"forward_ms\": {:.2f}, \"backward_ms\": {:.2f}, \"optimizer_ms\": {:.2f}, \"last_loss\": {:.4f}",
      a.backend, ms(r->step_s), r->tokens_per_step / r->step_s, achieved / ref.peak_gflops, gemm_eff,
      ref.peak_gflops, ref.source, gemm_peak, achieved, a.dtype, a.model.str(), a.model.num_parameters(), a.batch, a.seq,
      ms(r->forward_s), ms(r->backward_s), ms(r->optimizer_s), r->last_loss);
  if (cuda) {
    Result<cuda::MemoryInfo> mem = cuda::memory_info();
    const double used_gib = mem.ok() ? (mem->total_bytes - mem->free_bytes) / (1024.0 * 1024.0 * 1024.0) : 0.0;
    out += fmt::format(", \"device\": \"{}\", \"device_memory_used_gib\": {:.2f}", device_name, used_gib);
  } else {
    // Per-op times (the CPU's profiled kernels), and what no kernel timer saw.
    auto op = [&](OpKind k) { return ms(r->ops.seconds[static_cast<int>(k)]); };
    out += fmt::format(
        ", \"matmul_ms\": {:.1f}, \"attention_ms\": {:.1f}, \"layernorm_ms\": {:.1f}, \"elementwise_ms\": {:.1f}, "
        "\"crossentropy_ms\": {:.1f}, \"encoder_ms\": {:.1f}, \"adamw_ms\": {:.1f}, \"untimed_ms\": {:.1f}",
        op(OpKind::kMatmul), op(OpKind::kAttention), op(OpKind::kLayernorm), op(OpKind::kElementwise),
        op(OpKind::kCrossEntropy), op(OpKind::kEncoder), op(OpKind::kAdamW),
        ms(r->forward_s + r->backward_s + r->optimizer_s - r->ops.total()));
  }
  std::printf("%s}\n", out.c_str());
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);

  auto g = std::make_shared<GemmArgs>();
  CLI::App* gemm = bench->add_subcommand("gemm", "oneDNN matmul peak on large square sizes (GFLOP/s)");
  gemm->add_option("--dtype", g->dtype, "fp32 or bf16 inputs (fp32 accumulation)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  gemm->add_option("--sizes", g->sizes, "square sizes")->check(CLI::PositiveNumber);
  gemm->add_option("--iters", g->iters, "timed runs per size (best is kept)")->check(CLI::PositiveNumber);
  gemm->callback([g] { exit_code() = run_gemm(*g); });

  auto t = std::make_shared<TrainArgs>();
  CLI::App* train = bench->add_subcommand("train", "Training-step throughput and MFU on random tokens");
  train->add_option("--layers", t->model.layers)->check(CLI::PositiveNumber);
  train->add_option("--heads", t->model.heads)->check(CLI::PositiveNumber);
  train->add_option("--dim", t->model.channels)->check(CLI::PositiveNumber);
  train->add_option("--vocab", t->model.vocab)->check(CLI::PositiveNumber);
  train->add_option("--context", t->model.context, "default: --seq")->check(CLI::PositiveNumber);
  train->add_option("--arch", t->arch, "gpt2, or llama (RMSNorm, rotary positions, SwiGLU, untied head)")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  train->add_option("--kv-heads", t->model.kv_heads, "llama: key/value heads (default: --heads)")
      ->check(CLI::PositiveNumber);
  train->add_option("--mlp-hidden", t->model.mlp_hidden, "llama: SwiGLU width (default: 4 x --dim)")
      ->check(CLI::PositiveNumber);
  train->add_option("--batch", t->batch)->check(CLI::PositiveNumber);
  train->add_option("--seq", t->seq)->check(CLI::PositiveNumber);
  train->add_option("--steps", t->steps, "timed steps (the median is reported)")->check(CLI::PositiveNumber);
  train->add_option("--warmup", t->warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  train->add_option("--dtype", t->dtype)->check(CLI::IsMember({"fp32", "bf16"}));
  train->add_option("--profile", t->profile,
                    "doctor profile (tessera doctor --save): MFU against its theoretical peak, gemm_efficiency against "
                    "its measured GEMM peak (default: $TESSERA_PROFILE, else this machine's theoretical peak)");
  train->add_option("--peak-gflops", t->peak_gflops,
                    "--backend cpu: a stated machine peak for MFU, overriding the profile's and the theoretical one")
      ->check(CLI::PositiveNumber);
  train->add_option("--backend", t->backend, "cpu (oneDNN kernels, default) or cuda (the GPU, device 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train->add_option("--peak-tflops", t->peak_tflops,
                    "--backend cuda: device peak for MFU (default: the device's datasheet dense bf16 peak, 989 when "
                    "unknown)")
      ->check(CLI::PositiveNumber);
  train->callback([t] { exit_code() = run_train_bench(*t); });
  add_bench_decode_command(*bench);  // decode (cmd_bench_decode.cc)
  add_bench_serve_command(*bench);   // serve: load on an OpenAI-compatible server (cmd_bench_serve.cc)
  add_bench_dlrm_command(*bench);    // dlrm: single-process DLRM training (cmd_synth.cc)
  add_bench_dlrm_parallel_command(*bench);  // dlrm-parallel: model-parallel DLRM (cmd_bench_dlrm.cc)
  add_bench_dlrm_ops_command(*bench);  // dlrm-ops: lookup and MLP breakdown (cmd_bench_dlrm_ops.cc)
  add_bench_comm_commands(*bench);  // allreduce, reduce_scatter, ... (cmd_bench_comm.cc)
}

}  // namespace tessera::tools

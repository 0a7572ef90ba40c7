// tessera bench gemm | train: the oneDNN matmul peak, and training-step
// throughput with MFU against that measured peak (CPU) or a stated device
// peak (--backend cuda: 989 TFLOP/s, H100/H200 SXM dense bf16, by default).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/cpu_features.h"
#include "kernels/cpu/onednn_info.h"
#include "kernels/cpu/matmul_peak.h"
#include "runtime/cuda_device.h"
#include "tensor/device_memory.h"
#include "nn/gpt.h"
#include "obs/op_timer.h"
#include "tools/commands.h"
#include "train/flops.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"

namespace tessera::tools {

namespace {

// A fixed pseudo-random batch of n input and target token ids in [0, vocab).
void random_batch(int vocab, int n, std::vector<int>* inputs, std::vector<int>* targets) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  inputs->resize(n);
  targets->resize(n);
  for (int i = 0; i < n; i++) {
    (*inputs)[i] = tok(rng);
    (*targets)[i] = tok(rng);
  }
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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
    double g = cpu::measure_matmul_gflops(n, prec, a.iters);
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
  int batch = 8, seq = 256, steps = 5, warmup = 1;
  std::string dtype = "fp32";
  double peak_gflops = 0.0;  // 0: measure
  std::string backend = "cpu";
  double peak_tflops = kCudaPeakTflops;  // --backend cuda
};

int run_cuda_train_bench(const TrainArgs& a);

// zero_grad() and backward() of the whole model, a device failure returned.
Status step_backward(GPT& model) {
  RETURN_IF_ERROR(model.zero_grad());
  return model.backward_stage(0, 1.0f);
}

int run_train_bench(TrainArgs a) {
  if (a.backend == "cuda") return run_cuda_train_bench(a);
  if (a.model.context <= 0) a.model.context = a.seq;
  if (Status st = a.model.validate(); !st.ok()) return fail(st);
  if (a.seq > a.model.context)
    return fail(Status::InvalidArgument(fmt::format("--seq {} exceeds --context {}", a.seq, a.model.context)));
  MatmulPrecision prec = parse_dtype(a.dtype);
  double peak = a.peak_gflops > 0 ? a.peak_gflops : cpu::measure_matmul_gflops(4096, prec, 3);

  Result<std::unique_ptr<GPT>> made = GPT::create(a.model, Backend::kCPUProfiled);
  if (!made.ok()) return fail(made.status());
  GPT& model = **made;
  model.set_precision(prec);
  if (Status st = model.init_weights(1234); !st.ok()) return fail(st);
  Result<AdamW> opt = AdamW::create(gpt_param_space(model), gpt_adamw_kernel(model));
  if (!opt.ok()) return fail(opt.status());
  OptimizerConfig oc;
  oc.steps = a.warmup + a.steps;
  const int BT = a.batch * a.seq;
  std::vector<int> inputs, targets;
  random_batch(a.model.vocab, BT, &inputs, &targets);

  std::vector<double> step_s;
  double fwd_s = 0, bwd_s = 0, opt_s = 0;
  OpTimes sum;
  for (int s = 0; s < a.warmup + a.steps; s++) {
    op_times().reset();
    auto t0 = Clock::now();
    Result<float> loss = model.try_forward(inputs.data(), targets.data(), a.batch, a.seq);
    if (!loss.ok()) return fail(loss.status());
    double t_fwd = seconds_since(t0);
    if (Status st = step_backward(model); !st.ok()) return fail(st);
    double t_bwd = seconds_since(t0) - t_fwd;
    if (Result<float> norm = opt->try_step(oc, lr_at(oc, s)); !norm.ok()) return fail(norm.status());
    double total = seconds_since(t0);
    std::fprintf(stderr, "step %d: loss %.4f, %.0f ms\n", s, *loss, total * 1e3);
    if (s < a.warmup) continue;
    step_s.push_back(total);
    fwd_s += t_fwd;
    bwd_s += t_bwd;
    opt_s += total - t_fwd - t_bwd;
    for (int k = 0; k < static_cast<int>(OpKind::kCount); k++) sum.seconds[k] += op_times().seconds[k];
  }
  std::sort(step_s.begin(), step_s.end());
  double median = step_s[step_s.size() / 2];
  double flops = flops_per_token(a.model, a.seq) * BT;
  double mfu = flops / median / (peak * 1e9);
  const double n = a.steps;
  auto ms = [&](OpKind k) { return sum.seconds[static_cast<int>(k)] / n * 1e3; };
  double mean_ms = (fwd_s + bwd_s + opt_s) / n * 1e3;
  double kernels_ms = sum.total() / n * 1e3;
  std::printf(
      "{\"step_ms\": %.1f, \"tokens_per_s\": %.1f, \"mfu\": %.3f, \"peak_gflops\": %.1f, \"achieved_gflops\": %.1f, "
      "\"dtype\": \"%s\", \"params\": %lld, \"batch\": %d, \"seq\": %d, \"forward_ms\": %.1f, \"backward_ms\": %.1f, "
      "\"optimizer_ms\": %.1f, \"matmul_ms\": %.1f, \"attention_ms\": %.1f, \"layernorm_ms\": %.1f, "
      "\"elementwise_ms\": %.1f, \"crossentropy_ms\": %.1f, \"encoder_ms\": %.1f, \"adamw_ms\": %.1f, "
      "\"untimed_ms\": %.1f}\n",
      median * 1e3, BT / median, mfu, peak, flops / median / 1e9, a.dtype.c_str(),
      static_cast<long long>(a.model.num_parameters()), a.batch, a.seq, fwd_s / n * 1e3, bwd_s / n * 1e3,
      opt_s / n * 1e3, ms(OpKind::kMatmul), ms(OpKind::kAttention), ms(OpKind::kLayernorm), ms(OpKind::kElementwise),
      ms(OpKind::kCrossEntropy), ms(OpKind::kEncoder), ms(OpKind::kAdamW), mean_ms - kernels_ms);
  return kExitOk;
}

// --backend cuda: the same step on the GPU. Kernels run asynchronously, so
// the phases are timed with a device synchronize at each boundary (forward
// already ends with one: the loss is copied back). No per-op breakdown.
int run_cuda_train_bench(const TrainArgs& a) {
  if (Status st = backend_available(Backend::kCUDA); !st.ok()) return fail(st);
  Result<int> device = cuda::select_device(0);
  if (!device.ok()) return fail(device.status());
  const MatmulPrecision prec = parse_dtype(a.dtype);
  const double peak = a.peak_tflops * 1e3;  // GFLOP/s
  if (peak <= 0) return fail(Status::InvalidArgument("--peak-tflops must be positive"));

  Result<std::unique_ptr<GPT>> made = GPT::create(a.model, Backend::kCUDA);
  if (!made.ok()) return fail(made.status());
  GPT& model = **made;
  model.set_precision(prec);
  if (Status st = model.init_weights(1234); !st.ok()) return fail(st);
  Result<AdamW> opt = AdamW::create(gpt_param_space(model), gpt_adamw_kernel(model));
  if (!opt.ok()) return fail(opt.status());
  OptimizerConfig oc;
  oc.steps = a.warmup + a.steps;
  const int BT = a.batch * a.seq;
  std::vector<int> inputs, targets;
  random_batch(a.model.vocab, BT, &inputs, &targets);
  auto sync = [] { return synchronize(Device::kCUDA).With("CUDA error"); };
  if (Status st = model.try_reserve_activations(a.batch, a.seq, 1); !st.ok()) return fail(st);
  if (Status st = sync(); !st.ok()) return fail(st);
  std::vector<double> step_s;
  double fwd_s = 0, bwd_s = 0, opt_s = 0;
  float loss = 0.0f;
  for (int s = 0; s < a.warmup + a.steps; s++) {
    auto t0 = Clock::now();
    Result<float> fwd = model.try_forward(inputs.data(), targets.data(), a.batch, a.seq);  // ends with a blocking copy
    if (!fwd.ok()) return fail(fwd.status());
    loss = *fwd;
    double t_fwd = seconds_since(t0);
    if (Status st = step_backward(model); !st.ok()) return fail(st);
    if (Status st = sync(); !st.ok()) return fail(st);
    double t_bwd = seconds_since(t0) - t_fwd;
    if (Result<float> norm = opt->try_step(oc, lr_at(oc, s)); !norm.ok()) return fail(norm.status());
    if (Status st = sync(); !st.ok()) return fail(st);
    double total = seconds_since(t0);
    std::fprintf(stderr, "step %d: loss %.4f, %.1f ms\n", s, loss, total * 1e3);
    if (!std::isfinite(loss)) return fail(Status::Internal(fmt::format("loss became {} at step {}", loss, s)));
    if (s < a.warmup) continue;
    step_s.push_back(total);
    fwd_s += t_fwd;
    bwd_s += t_bwd;
    opt_s += total - t_fwd - t_bwd;
  }
  std::sort(step_s.begin(), step_s.end());
  const double median = step_s[step_s.size() / 2];
  const double flops = flops_per_token(a.model, a.seq) * BT;
  const double n = a.steps;
  Result<cuda::MemoryInfo> mem = cuda::memory_info();
  const double used_gib = mem.ok() ? (mem->total_bytes - mem->free_bytes) / (1024.0 * 1024.0 * 1024.0) : 0.0;
  const std::string name = cuda::device_summary(*device);
  std::printf(
      "{\"backend\": \"cuda\", \"device\": \"%s\", \"step_ms\": %.2f, \"tokens_per_s\": %.1f, \"mfu\": %.4f, "
      "\"peak_tflops\": %.1f, \"achieved_tflops\": %.2f, \"dtype\": \"%s\", \"params\": %lld, \"batch\": %d, "
      "\"seq\": %d, \"forward_ms\": %.2f, \"backward_ms\": %.2f, \"optimizer_ms\": %.2f, \"last_loss\": %.4f, "
      "\"device_memory_used_gib\": %.2f}\n",
      name.c_str(), median * 1e3, BT / median, flops / median / (peak * 1e9), a.peak_tflops, flops / median / 1e12,
      a.dtype.c_str(), static_cast<long long>(a.model.num_parameters()), a.batch, a.seq, fwd_s / n * 1e3,
      bwd_s / n * 1e3, opt_s / n * 1e3, loss, used_gib);
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
  train->add_option("--batch", t->batch)->check(CLI::PositiveNumber);
  train->add_option("--seq", t->seq)->check(CLI::PositiveNumber);
  train->add_option("--steps", t->steps, "timed steps (the median is reported)")->check(CLI::PositiveNumber);
  train->add_option("--warmup", t->warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  train->add_option("--dtype", t->dtype)->check(CLI::IsMember({"fp32", "bf16"}));
  train->add_option("--peak-gflops", t->peak_gflops,
                    "--backend cpu: matmul peak for MFU (default: measure a 4096^3 gemm)");
  train->add_option("--backend", t->backend, "cpu (oneDNN kernels, default) or cuda (the GPU, device 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train->add_option("--peak-tflops", t->peak_tflops,
                    "--backend cuda: device peak for MFU (default 989, H100/H200 SXM dense bf16)")
      ->check(CLI::PositiveNumber);
  train->callback([t] { exit_code() = run_train_bench(*t); });
  add_bench_decode_command(*bench);  // decode (cmd_bench_decode.cc)
  add_bench_serve_command(*bench);   // serve: load on an OpenAI-compatible server (cmd_bench_serve.cc)
  add_bench_comm_commands(*bench);  // allreduce, reduce_scatter, ... (cmd_bench_comm.cc)
}

}  // namespace tessera::tools

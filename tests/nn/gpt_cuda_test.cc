// GPT on the CUDA backend against GPT on the CPU backend, on a random small
// model: the same initial weights bit for bit, then logits, loss, every
// gradient, AdamW steps and a two-stage pipeline split. The CUDA model runs
// flash attention (cuda::set_attention_preference, the default) and the chunked
// output layer; the small batches here fit in one head chunk, so try_logits()
// stays available, and FlashAttentionAndChunkedHeadMatchTheCpu splits the
// head into several chunks. (Parity with the PyTorch reference is in
// gpt_parity_test.cc, whose table has CUDA rows, one head chunk too.)
// Without a device (or without the CUDA backend compiled in) every test but
// the first is skipped, saying why.
#include <cmath>
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/try.h"
#include "runtime/cuda_device.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "tensor/device_memory.h"
#include "test_util.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::allocate_or_die;
using testing_util::backward_or_die;
using testing_util::clone_layout_or_die;
using testing_util::copy_from_or_die;
using testing_util::copy_to_device_or_die;
using testing_util::copy_to_host_or_die;
using testing_util::forward_or_die;
using testing_util::global_norm_or_die;
using testing_util::logits_or_die;
using testing_util::losses_or_die;
using testing_util::make_adamw;
using testing_util::make_gpt;
using testing_util::normalised_error;
using testing_util::reserve_activations_or_die;
using testing_util::step_or_die;

// fp32 on both sides (cuBLASLt without TF32, the CPU's oneDNN fp32); the two
// differ only in summation order, as each does from PyTorch (2e-5 there).
constexpr double kTolF32 = 4e-5;

TEST(GptCuda, UnavailableBackendIsAClearError) {
  const Status st = backend_available(Backend::kCUDA);
  if (st.ok()) {
    EXPECT_GT(cuda::device_count(), 0);
    return;
  }
  EXPECT_FALSE(st.message().empty());
  for (const char ch : st.message()) EXPECT_TRUE(std::isprint(static_cast<unsigned char>(ch))) << st.message();
  EXPECT_TRUE(backend_available(Backend::kCPU).ok());
}

#define SKIP_WITHOUT_CUDA()                                                        \
  do {                                                                             \
    const Status _st = backend_available(Backend::kCUDA);                          \
    if (!_st.ok()) GTEST_SKIP() << _st.message();                                  \
    const Status _dev = cuda::set_device(0);                                       \
    if (!_dev.ok()) GTEST_SKIP() << "no CUDA device: " << _dev.message();          \
  } while (0)

const GPTConfig kConfig{.layers = 2, .heads = 4, .channels = 64, .vocab = 200, .context = 32};  // Vp = 256
constexpr int kB = 4, kT = 32;

struct Batch {
  std::vector<int> inputs, targets;
};

Batch random_batch(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, kConfig.vocab - 1);
  Batch b;
  for (int i = 0; i < kB * kT; i++) {
    b.inputs.push_back(tok(rng));
    b.targets.push_back(tok(rng));
  }
  return b;
}

// The arena's bytes on the host, whatever its device.
std::vector<char> host_bytes(const Arena& a) {
  Arena host = clone_layout_or_die(a, Device::kCPU);
  copy_from_or_die(host, a);
  return std::vector<char>(host.base(), host.base() + host.bytes());
}

void expect_arenas_close(const GPT& cuda_model, const Arena& cuda_arena, const GPT& cpu_model, const Arena& cpu_arena,
                         double tol) {
  std::vector<HfTensor> ours = value_or_abort(to_hf_tensors(cuda_model, cuda_arena));
  std::vector<HfTensor> ref = value_or_abort(to_hf_tensors(cpu_model, cpu_arena));
  ASSERT_EQ(ours.size(), ref.size());
  for (size_t i = 0; i < ours.size(); i++) {
    SCOPED_TRACE(ref[i].name);
    ASSERT_EQ(ours[i].data.size(), ref[i].data.size());
    EXPECT_LE(normalised_error(ours[i].data.data(), ref[i].data.data(), static_cast<int64_t>(ref[i].data.size())),
              tol);
  }
}

TEST(GptCuda, InitWeightsMatchTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  auto cpu = make_gpt(kConfig, Backend::kCPU);
  auto gpu = make_gpt(kConfig, Backend::kCUDA);
  cpu->init_weights(42);
  gpu->init_weights(42);
  EXPECT_EQ(gpu->params().device(), Device::kCUDA);
  EXPECT_EQ(gpu->params().tensor(kWte).device, Device::kCUDA);
  EXPECT_EQ(host_bytes(gpu->params()), host_bytes(cpu->params()));
}

TEST(GptCuda, LogitsLossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  auto cpu = make_gpt(kConfig, Backend::kCPU);
  auto gpu = make_gpt(kConfig, Backend::kCUDA);
  cpu->init_weights(7);
  gpu->init_weights(7);
  const Batch b = random_batch(1);
  const float ref_loss = forward_or_die(*cpu, b.inputs.data(), b.targets.data(), kB, kT);
  const float loss = forward_or_die(*gpu, b.inputs.data(), b.targets.data(), kB, kT);
  EXPECT_NEAR(loss, ref_loss, kTolF32 * ref_loss);
  const int64_t n_logits = int64_t{kB} * kT * kConfig.padded_vocab();
  const float* ref_logits = logits_or_die(*cpu);
  const float* logits = logits_or_die(*gpu);  // a host copy
  EXPECT_LE(normalised_error(logits, ref_logits, n_logits), kTolF32);
  EXPECT_LE(normalised_error(losses_or_die(*gpu), losses_or_die(*cpu), kB * kT), kTolF32);

  cpu->zero_grad();
  backward_or_die(*cpu);
  gpu->zero_grad();
  backward_or_die(*gpu);
  expect_arenas_close(*gpu, gpu->grads(), *cpu, cpu->grads(), kTolF32);

  // Forward without targets: logits only, loss 0.
  EXPECT_EQ(forward_or_die(*gpu, b.inputs.data(), nullptr, kB, kT), 0.0f);
  EXPECT_LE(normalised_error(logits_or_die(*gpu), ref_logits, n_logits), kTolF32);
  EXPECT_TRUE(cuda::synchronize().ok());
}

// AdamW's first moments (flat, on the model's device) laid out as the
// model's parameter arena, on the host.
Arena first_moments(const GPT& model, const AdamW& opt) {
  Arena a = clone_layout_or_die(model.params(), Device::kCPU);
  copy_to_host_or_die(model.device(), a.base(), opt.m(), model.params().bytes());
  return a;
}

TEST(GptCuda, AdamWStepsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  auto cpu = make_gpt(kConfig, Backend::kCPU);
  auto gpu = make_gpt(kConfig, Backend::kCUDA);
  cpu->init_weights(3);
  gpu->init_weights(3);
  AdamW cpu_opt = make_adamw(gpt_param_space(*cpu), gpt_adamw_kernel(*cpu));
  AdamW gpu_opt = make_adamw(gpt_param_space(*gpu), gpt_adamw_kernel(*gpu));
  EXPECT_EQ(gpu_opt.space().device, Device::kCUDA);
  OptimizerConfig oc;
  oc.lr = 1e-3f;
  oc.warmup = 2;
  oc.steps = 5;
  oc.grad_clip = 0.5f;  // clipping on: the device norm feeds the update
  for (int step = 0; step < oc.steps; step++) {
    SCOPED_TRACE(step);
    const Batch b = random_batch(100 + step);
    const float ref_loss = forward_or_die(*cpu, b.inputs.data(), b.targets.data(), kB, kT);
    const float loss = forward_or_die(*gpu, b.inputs.data(), b.targets.data(), kB, kT);
    cpu->zero_grad();
    backward_or_die(*cpu);
    gpu->zero_grad();
    backward_or_die(*gpu);
    const float ref_norm = step_or_die(cpu_opt, oc, lr_at(oc, step));
    const float norm = step_or_die(gpu_opt, oc, lr_at(oc, step));
    EXPECT_NEAR(loss, ref_loss, 5 * kTolF32 * ref_loss);
    EXPECT_NEAR(norm, ref_norm, 5 * kTolF32 * ref_norm);
  }
  expect_arenas_close(*gpu, gpu->params(), *cpu, cpu->params(), 5 * kTolF32);
  expect_arenas_close(*gpu, first_moments(*gpu, gpu_opt), *cpu, first_moments(*cpu, cpu_opt), 5 * kTolF32);
}

TEST(GptCuda, GlobalNormIsDeterministicAndMatchesTheHost) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {0, 1, 255, 256 * 512 + 3, 3'000'001}) {
    SCOPED_TRACE(n);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    Arena a;
    a.set_device(Device::kCUDA);
    a.reserve("x", DType::kF32, {n});
    allocate_or_die(a);
    copy_to_device_or_die(Device::kCUDA, a.base(), x.data(), sizeof(float) * n);
    const float norm = global_norm_or_die(Device::kCUDA, a.tensor(0).f32(), n);
    EXPECT_NEAR(norm, global_norm(x.data(), n), 1e-6 * std::max(1.0f, norm));
    EXPECT_EQ(global_norm_or_die(Device::kCUDA, a.tensor(0).f32(), n), norm);  // same bits again
  }
}

// Two pipeline stages on the device (layers [0,1) and [1,2)), the activation
// and its gradient handed over through the host, against the whole model.
TEST(GptCuda, PipelineStagesMatchTheWholeModel) {
  SKIP_WITHOUT_CUDA();
  auto whole = make_gpt(kConfig, Backend::kCUDA);
  ModelShard s0, s1;
  s0.layer_begin = 0;
  s0.layer_end = 1;
  s1.layer_begin = 1;
  s1.layer_end = 2;
  auto first = make_gpt(kConfig, Backend::kCUDA, s0);
  auto last = make_gpt(kConfig, Backend::kCUDA, s1);
  whole->init_weights(11);
  first->init_weights(11);
  last->init_weights(11);
  const Batch b = random_batch(2);
  const float ref_loss = forward_or_die(*whole, b.inputs.data(), b.targets.data(), kB, kT);
  whole->zero_grad();
  backward_or_die(*whole);

  const size_t bytes = sizeof(float) * kB * kT * kConfig.channels;
  std::vector<float> message(kB * kT * kConfig.channels);
  reserve_activations_or_die(*first, kB, kT, 1);
  reserve_activations_or_die(*last, kB, kT, 1);
  first->zero_grad();
  last->zero_grad();
  float loss = 0.0f;
  ASSERT_TRUE(first->forward_stage(0, b.inputs.data(), nullptr, kB, kT, nullptr).ok());
  copy_to_host_or_die(Device::kCUDA, message.data(), first->stage_output(0), bytes);
  copy_to_device_or_die(Device::kCUDA, last->stage_input(0), message.data(), bytes);
  ASSERT_TRUE(last->forward_stage(0, nullptr, b.targets.data(), kB, kT, &loss).ok());
  EXPECT_NEAR(loss, ref_loss, 1e-6 * ref_loss);  // the same kernels in the same order
  ASSERT_TRUE(last->backward_stage(0, 1.0f).ok());
  copy_to_host_or_die(Device::kCUDA, message.data(), last->stage_input_grad(0), bytes);
  copy_to_device_or_die(Device::kCUDA, first->stage_output_grad(), message.data(), bytes);
  ASSERT_TRUE(first->backward_stage(0, 1.0f).ok());

  // Layer 1's gradients on the last stage, layer 0's and wpe on the first.
  Arena whole_grads = clone_layout_or_die(whole->grads(), Device::kCPU);
  Arena g0 = clone_layout_or_die(first->grads(), Device::kCPU), g1 = clone_layout_or_die(last->grads(), Device::kCPU);
  copy_from_or_die(whole_grads, whole->grads());
  copy_from_or_die(g0, first->grads());
  copy_from_or_die(g1, last->grads());
  // The same kernels on the same data; only encoder_backward's atomicAdd
  // into wte may reorder sums, so allow rounding.
  constexpr double kTol = 1e-6;
  for (int id = kLn1W; id <= kFcProjB; id++) {
    SCOPED_TRACE(param_name(id));
    const int64_t per_layer = whole_grads.tensor(id).numel() / kConfig.layers;
    const float* w = whole_grads.tensor(id).f32();
    EXPECT_LE(normalised_error(g0.tensor(id).f32(), w, per_layer), kTol);
    EXPECT_LE(normalised_error(g1.tensor(id).f32(), w + per_layer, per_layer), kTol);
  }
  EXPECT_LE(normalised_error(g0.tensor(kWpe).f32(), whole_grads.tensor(kWpe).f32(), whole_grads.tensor(kWpe).numel()),
            kTol);
  EXPECT_LE(
      normalised_error(g1.tensor(kLnfW).f32(), whole_grads.tensor(kLnfW).f32(), whole_grads.tensor(kLnfW).numel()),
      kTol);
  // wte's gradient is split: the first stage's embedding part plus the last
  // stage's output-layer part.
  std::vector<float> wte_sum(whole_grads.tensor(kWte).numel());
  for (size_t i = 0; i < wte_sum.size(); i++) wte_sum[i] = g0.tensor(kWte).f32()[i] + g1.tensor(kWte).f32()[i];
  EXPECT_LE(normalised_error(wte_sum.data(), whole_grads.tensor(kWte).f32(), static_cast<int64_t>(wte_sum.size())),
            kTol);
}

// Shapes where the CUDA model's own paths matter: head sizes 64 and 128
// (flash attention's widest), T not a multiple of its 32-row tiles, and a
// head chunk that splits B*T unevenly (225 rows = 3 x 64 + 33; 80 = 48 + 32),
// so forward computes the loss over several chunks and backward recomputes
// every chunk's logits but the one still held.
struct ChunkedCase {
  GPTConfig config;
  int B, T, chunk_rows;
};

std::vector<int> random_tokens(int n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, V - 1);
  std::vector<int> ids(n);
  for (int& id : ids) id = tok(rng);
  return ids;
}

// Loss, per-position losses and every gradient of the first step, then five
// AdamW steps with clipping, against the CPU model; and the chunked head
// against the same CUDA model with one chunk (only the order in which the
// chunks add into d(wte) differs). fp32 on both sides, but wider sums than
// the small model above (C up to 256, 4C = 1024 terms): 1e-4.
TEST(GptCuda, FlashAttentionAndChunkedHeadMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  constexpr double kTol = 1e-4;
  for (const ChunkedCase& c : {ChunkedCase{GPTConfig{2, 2, 128, 300, 80}, 3, 75, 64},
                               ChunkedCase{GPTConfig{1, 2, 256, 1000, 48}, 2, 40, 48}}) {
    SCOPED_TRACE(c.config.str());
    const int BT = c.B * c.T;
    auto cpu = make_gpt(c.config, Backend::kCPU);
    auto gpu = make_gpt(c.config, Backend::kCUDA);
    auto one_chunk = make_gpt(c.config, Backend::kCUDA);
    gpu->set_head_chunk_rows(c.chunk_rows);
    ASSERT_GT(BT, c.chunk_rows);
    ASSERT_LE(BT, one_chunk->head_chunk_rows());
    cpu->init_weights(21);
    gpu->init_weights(21);
    one_chunk->init_weights(21);
    AdamW cpu_opt = make_adamw(gpt_param_space(*cpu), gpt_adamw_kernel(*cpu));
    AdamW gpu_opt = make_adamw(gpt_param_space(*gpu), gpt_adamw_kernel(*gpu));
    OptimizerConfig oc;
    oc.lr = 1e-3f;
    oc.warmup = 2;
    oc.steps = 5;
    oc.grad_clip = 1.0f;
    for (int step = 0; step < oc.steps; step++) {
      SCOPED_TRACE(step);
      const std::vector<int> inputs = random_tokens(BT, c.config.vocab, 300 + 2 * step);
      const std::vector<int> targets = random_tokens(BT, c.config.vocab, 301 + 2 * step);
      const float ref_loss = forward_or_die(*cpu, inputs.data(), targets.data(), c.B, c.T);
      const float loss = forward_or_die(*gpu, inputs.data(), targets.data(), c.B, c.T);
      EXPECT_NEAR(loss, ref_loss, (step == 0 ? 1 : 5) * kTol * ref_loss);
      cpu->zero_grad();
      backward_or_die(*cpu);
      gpu->zero_grad();
      backward_or_die(*gpu);
      if (step == 0) {
        EXPECT_LE(normalised_error(losses_or_die(*gpu), losses_or_die(*cpu), BT), kTol);
        expect_arenas_close(*gpu, gpu->grads(), *cpu, cpu->grads(), kTol);
        // No (T,T) attention matrices (with flash) and no full-vocabulary
        // logits, probabilities or dlogits on the device.
        EXPECT_LT(gpu->activation_bytes(), cpu->activation_bytes());

        const float one_loss = forward_or_die(*one_chunk, inputs.data(), targets.data(), c.B, c.T);
        EXPECT_NEAR(one_loss, loss, 1e-5 * loss);
        one_chunk->zero_grad();
        backward_or_die(*one_chunk);
        expect_arenas_close(*gpu, gpu->grads(), *one_chunk, one_chunk->grads(), 1e-5);
      }
      const float ref_norm = step_or_die(cpu_opt, oc, lr_at(oc, step));
      const float norm = step_or_die(gpu_opt, oc, lr_at(oc, step));
      EXPECT_NEAR(norm, ref_norm, 5 * kTol * ref_norm);
    }
    expect_arenas_close(*gpu, gpu->params(), *cpu, cpu->params(), 5 * kTol);
    expect_arenas_close(*gpu, first_moments(*gpu, gpu_opt), *cpu, first_moments(*cpu, cpu_opt), 5 * kTol);
    EXPECT_TRUE(cuda::synchronize().ok());
  }
}

}  // namespace
}  // namespace tessera

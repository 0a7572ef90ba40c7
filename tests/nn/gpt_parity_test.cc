// Whole-model parity with PyTorch: tests/reference/make_reference.py built a
// tiny GPT-2 (L=2, NH=4, C=64, V=99 -> Vp=128, maxT=32) and dumped its
// weights, one batch, the logits, the loss, every gradient and 10 AdamW steps.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "test_util.h"
#include <nlohmann/json.hpp>

#include "core/try.h"
#include "data/shard.h"
#include "io/safetensors.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::backward_or_die;
using testing_util::forward_or_die;
using testing_util::logits_or_die;
using testing_util::make_adamw;
using testing_util::make_gpt;
using testing_util::step_or_die;

const std::string kDir = std::string(TESSERA_TEST_DATA_DIR) + "/reference/";

// Tolerances, as max |ours - torch| / max(1, max |torch|) per tensor.
// fp32: both sides are fp32 with different summation orders; measured
// differences are ~1e-6, so 2e-5 leaves headroom without hiding a real bug
// (a wrong sign or a missed term shows up at >= 1e-3).
constexpr double kTolF32 = 2e-5;
// bf16 rounds every matmul input to 8 bits of mantissa (relative error 2^-9
// per operand); against the fp32 reference that is ~1e-2 on logits.
constexpr double kTolBF16 = 3e-2;

struct Reference {
  nlohmann::json json;
  std::vector<int> inputs, targets;
  int B = 0, T = 0;
};

Reference load_reference() {
  Reference r;
  std::ifstream in(kDir + "reference.json");
  r.json = nlohmann::json::parse(in);
  r.B = r.json["batch"];
  r.T = r.json["seq"];
  auto tokens = data::read_shard(kDir + "tokens.bin");
  EXPECT_TRUE(tokens.ok()) << tokens.status().message();
  const auto& tok = tokens.value();
  for (int i = 0; i < r.B * r.T; i++) {
    r.inputs.push_back(tok[i]);
    r.targets.push_back(tok[i + 1]);
  }
  return r;
}

using testing_util::normalised_error;

std::unique_ptr<GPT> load_model(Backend backend, const std::string& file = "gpt2_tiny.safetensors") {
  auto m = load_gpt2(kDir + file, nullptr, backend);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

struct Case {
  Backend backend;
  MatmulPrecision prec;
  double tol;
};

class GptParity : public ::testing::TestWithParam<Case> {};

// CUDA rows skip, saying why, without the backend or a device.
#define SKIP_UNAVAILABLE(backend)                                 \
  do {                                                            \
    const Status _st = backend_available(backend);                \
    if (!_st.ok()) GTEST_SKIP() << _st.message();                 \
  } while (0)

TEST_P(GptParity, LogitsLossAndEveryGradient) {
  Case c = GetParam();
  SKIP_UNAVAILABLE(c.backend);
  Reference r = load_reference();
  auto model = load_model(c.backend);
  model->set_precision(c.prec);
  auto expected = io::SafetensorsFile::open(kDir + "expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status().message();

  float loss = forward_or_die(*model, r.inputs.data(), r.targets.data(), r.B, r.T);
  const double ref_loss = r.json["loss"];
  EXPECT_NEAR(loss, ref_loss, c.tol * ref_loss);

  const int V = model->config().vocab, Vp = model->config().padded_vocab();
  std::vector<float> ref_logits(r.B * r.T * V), ours(r.B * r.T * V);
  ASSERT_TRUE(expected->read_f32("logits", ref_logits).ok());
  const float* logits = logits_or_die(*model);  // host memory (a copy on CUDA)
  for (int i = 0; i < r.B * r.T; i++)
    for (int j = 0; j < V; j++) ours[i * V + j] = logits[i * Vp + j];
  EXPECT_LE(normalised_error(ours.data(), ref_logits.data(), ours.size()), c.tol);
  for (int i = 0; i < r.B * r.T; i++)  // padding columns are exactly zero
    for (int j = V; j < Vp; j++) ASSERT_EQ(logits[i * Vp + j], 0.0f);

  model->zero_grad();
  backward_or_die(*model);
  int checked = 0;
  for (const HfTensor& g : value_or_abort(to_hf_tensors(*model, model->grads()))) {
    SCOPED_TRACE(g.name);
    std::vector<float> ref(g.data.size());
    ASSERT_TRUE(expected->read_f32("grad." + g.name, ref).ok());
    EXPECT_LE(normalised_error(g.data.data(), ref.data(), ref.size()), c.tol);
    checked++;
  }
  EXPECT_EQ(checked, 2 + 12 * 2 + 2);  // wte, wpe, 12 per layer, ln_f
}

TEST_P(GptParity, TenAdamWStepsMatchTorch) {
  Case c = GetParam();
  SKIP_UNAVAILABLE(c.backend);
  Reference r = load_reference();
  auto model = load_model(c.backend);
  model->set_precision(c.prec);
  const auto& tj = r.json["train"];
  OptimizerConfig oc;
  oc.lr = tj["max_lr"];
  oc.min_lr = tj["min_lr"];
  oc.warmup = tj["warmup"];
  oc.steps = tj["steps"];
  oc.weight_decay = tj["weight_decay"];
  oc.beta1 = tj["beta1"];
  oc.beta2 = tj["beta2"];
  oc.eps = tj["eps"];
  oc.grad_clip = tj["grad_clip"];
  AdamW opt = make_adamw(gpt_param_space(*model), gpt_adamw_kernel(*model));
  for (int step = 0; step < oc.steps; step++) {
    SCOPED_TRACE(step);
    float loss = forward_or_die(*model, r.inputs.data(), r.targets.data(), r.B, r.T);
    model->zero_grad();
    backward_or_die(*model);
    float norm = step_or_die(opt, oc, lr_at(oc, step));
    const double ref_loss = tj["losses"][step];
    const double ref_norm = tj["grad_norms"][step];
    const double ref_lr = tj["lrs"][step];
    EXPECT_NEAR(lr_at(oc, step), ref_lr, 1e-9);
    // Errors compound over steps; 5x the single-step tolerance.
    EXPECT_NEAR(loss, ref_loss, 5 * c.tol * ref_loss);
    EXPECT_NEAR(norm, ref_norm, 5 * c.tol * ref_norm);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GptParity,
                         ::testing::Values(Case{Backend::kRef, MatmulPrecision::kF32, kTolF32},
                                           Case{Backend::kCPU, MatmulPrecision::kF32, kTolF32},
                                           Case{Backend::kCPU, MatmulPrecision::kBF16, kTolBF16}
#ifdef TESSERA_HAVE_CUDA
                                           ,  // cuBLASLt fp32 without TF32; bf16 inputs with fp32 accumulation
                                           Case{Backend::kCUDA, MatmulPrecision::kF32, kTolF32},
                                           Case{Backend::kCUDA, MatmulPrecision::kBF16, kTolBF16}
#endif
                                           ),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return std::string(backend_name(c.backend)) +
                                  (c.prec == MatmulPrecision::kF32 ? "_fp32" : "_bf16");
                         });

TEST(GptWeights, PrefixlessFileWithMaskBuffersLoadsTheSameWeights) {
  auto a = load_model(Backend::kCPU);
  auto b = load_model(Backend::kCPU, "gpt2_tiny_noprefix.safetensors");
  ASSERT_EQ(a->params().bytes(), b->params().bytes());
  EXPECT_EQ(std::memcmp(a->params().base(), b->params().base(), a->params().bytes()), 0);
}

TEST(GptWeights, SaveThenLoadRoundTripsExactly) {
  auto a = load_model(Backend::kCPU);
  std::string dir = ::testing::TempDir() + "/tessera_roundtrip";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(save_hf(*a, dir + "/model.safetensors").ok());
  auto b = load_gpt2(dir + "/model.safetensors", nullptr);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(std::memcmp(a->params().base(), b.value()->params().base(), a->params().bytes()), 0);
}

TEST(GptWeights, WrongShapeIsRejectedNamingTheTensor) {
  auto f = io::SafetensorsFile::open(kDir + "gpt2_tiny.safetensors");
  ASSERT_TRUE(f.ok());
  GPTConfig c{2, 4, 64, 99, 32};
  c.channels = 32;  // the file has 64
  auto model = make_gpt(c);
  Status st = load_hf_weights(*model, f.value());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("wte.weight"), std::string::npos) << st.message();
}

TEST(GptBatch, RejectsTokenOutsideVocabAndTooLongSequence) {
  auto model = make_gpt(GPTConfig{1, 2, 8, 10, 4});
  std::vector<int> ok = {1, 2, 3, 4}, bad = {1, 2, 10, 4};
  EXPECT_TRUE(model->check_batch(ok.data(), ok.data(), 1, 4).ok());
  Status st = model->check_batch(bad.data(), nullptr, 1, 4);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token id 10"), std::string::npos) << st.message();
  std::vector<int> longer(5, 1);
  st = model->check_batch(longer.data(), nullptr, 1, 5);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("context"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tessera

// Errors the world causes while making a model come back as a Status
// (GPT::create, try_reserve_activations, PagedKVCache::create): a bad
// config, a backend this process cannot run, memory the host cannot give.
// The out-of-memory cases run in a forked child whose address space is
// capped (RLIMIT_AS), so that a refused allocation is what the test sees
// whatever the machine's overcommit policy, never the OOM killer.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "nn/kv_cache.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::make_gpt;

const GPTConfig kTiny{2, 4, 64, 200, 32};

// More parameter bytes (about 1.6 TB) than any machine here has memory.
const GPTConfig kHuge{8, 1, 65536, 256, 16};

// In a forked child: no mapping above 64 GiB can succeed.
void cap_address_space() {
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = rlim_t{64} << 30;
  setrlimit(RLIMIT_AS, &lim);
}

// In a forked child: address space for `bytes` more than is mapped now
// (VmSize), so that an allocation of about that size is the first to fail.
void cap_address_space_at(int64_t bytes) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) std::exit(4);
  char line[256];
  long long vm_kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmSize: %lld kB", &vm_kb) == 1) break;
  std::fclose(f);
  if (vm_kb < 0) std::exit(4);
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(vm_kb * 1024 + bytes);
  setrlimit(RLIMIT_AS, &lim);
}

// Prints the error and exits 0 when st is an error with code `want`; 1 when
// it is OK, 2 for another code.
[[noreturn]] void exit_with(const Status& st, StatusCode want) {
  std::fprintf(stderr, "%s\n", st.ToString().c_str());
  std::exit(st.ok() ? 1 : st.code() == want ? 0 : 2);
}

TEST(GptStatus, CreateRejectsAnInvalidConfig) {
  GPTConfig c = kTiny;
  c.heads = 3;  // 64 channels do not split into 3 heads
  Result<std::unique_ptr<GPT>> m = GPT::create(c);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.status().message(), c.validate().message());
}

TEST(GptStatus, CreateRejectsAShardThatDoesNotFit) {
  ModelShard s;
  s.layer_begin = 1;
  s.layer_end = 5;  // the model has 2 layers
  Result<std::unique_ptr<GPT>> m = GPT::create(kTiny, Backend::kCPU, s);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.status().message(), s.validate(kTiny).message());
}

TEST(GptStatus, CreateRejectsTensorParallelismWithoutItsCommunicator) {
  ModelShard s;
  s.tp = 2;
  Result<std::unique_ptr<GPT>> m = GPT::create(kTiny, Backend::kCPU, s, nullptr);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
}

TEST(GptStatus, CreateOnAMissingCudaBackendNamesCuda) {
  const Status have = backend_available(Backend::kCUDA);
  if (have.ok()) GTEST_SKIP() << "a CUDA device is present";
  Result<std::unique_ptr<GPT>> m = GPT::create(kTiny, Backend::kCUDA);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("CUDA"), std::string::npos) << m.status().message();
}

TEST(GptStatus, CreateMakesAUsableModel) {
  Result<std::unique_ptr<GPT>> m = GPT::create(kTiny, Backend::kCPU, {}, nullptr, ModelUse::kInference);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE((*m)->params().allocated());
  EXPECT_FALSE((*m)->grads().allocated());
  EXPECT_TRUE((*m)->try_reserve_activations(2, 8, 1).ok());
}

TEST(GptStatusDeathTest, CreateOfAModelTooBigForMemoryIsAStatus) {
  EXPECT_EXIT(
      {
        cap_address_space();
        exit_with(GPT::create(kHuge).status(), StatusCode::kResourceExhausted);
      },
      ::testing::ExitedWithCode(0), "the parameters of L=8 NH=1 C=65536.*out of memory");
}

TEST(GptStatusDeathTest, ActivationsTooBigForMemoryAreAStatusAndKeepTheOld) {
  EXPECT_EXIT(
      {
        cap_address_space();
        auto model = make_gpt(kTiny);
        if (!model->try_reserve_activations(2, 8, 1).ok()) std::exit(2);
        const int64_t before = model->activation_bytes();
        const Status st = model->try_reserve_activations(1 << 16, 1 << 16, 1);
        if (model->activation_bytes() != before || model->activation_slots() != 1) std::exit(3);
        exit_with(st, StatusCode::kResourceExhausted);
      },
      ::testing::ExitedWithCode(0), "activations.*out of memory");
}

// The parameters fit, the gradients do not: the error names the gradients
// and nothing is left allocated (the model is never returned).
TEST(GptStatusDeathTest, GradientsTooBigForMemoryAreAStatusNamingThem) {
  const GPTConfig c{2, 4, 1024, 256, 16};  // about 101 MB of parameters
  const int64_t param_bytes = static_cast<int64_t>(param_layout(c, {}).bytes());
  EXPECT_EXIT(
      {
        cap_address_space_at(param_bytes * 3 / 2);
        exit_with(GPT::create(c).status(), StatusCode::kResourceExhausted);
      },
      ::testing::ExitedWithCode(0), "resource exhausted: the gradients of L=2 NH=4 C=1024.*host arena: out of memory");
}

// The same model for inference has no gradients: it fits where training's did not.
TEST(GptStatusDeathTest, AnInferenceModelNeedsNoRoomForGradients) {
  const GPTConfig c{2, 4, 1024, 256, 16};
  const int64_t param_bytes = static_cast<int64_t>(param_layout(c, {}).bytes());
  EXPECT_EXIT(
      {
        cap_address_space_at(param_bytes * 3 / 2);
        Result<std::unique_ptr<GPT>> m = GPT::create(c, Backend::kCPU, {}, nullptr, ModelUse::kInference);
        if (!m.ok()) exit_with(m.status(), StatusCode::kOk);
        std::exit((*m)->params().allocated() && !(*m)->grads().allocated() ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(KvCacheStatusDeathTest, APoolTooBigForMemoryIsAStatus) {
  EXPECT_EXIT(
      {
        cap_address_space();
        auto model = make_gpt(kTiny, Backend::kCPU, {}, nullptr, ModelUse::kInference);
        // 2^24 blocks of 16 positions: 2 x 2 layers x 2^28 rows x 64 floats, 256 GiB.
        exit_with(PagedKVCache::create(*model, 1 << 24).status(), StatusCode::kResourceExhausted);
      },
      ::testing::ExitedWithCode(0), "the KV cache \\(16777216 blocks of 16\\).*out of memory");
}

TEST(KvCacheStatus, CreateRejectsSizesBelowOne) {
  auto model = make_gpt(kTiny, Backend::kCPU, {}, nullptr, ModelUse::kInference);
  for (const auto& [blocks, block_size, seqs] : {std::tuple{0, 16, 4}, std::tuple{4, 0, 4}, std::tuple{4, 16, 0}}) {
    Result<std::unique_ptr<PagedKVCache>> c = PagedKVCache::create(*model, blocks, block_size, seqs);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().message();
  }
  Result<std::unique_ptr<PagedKVCache>> c = PagedKVCache::create(*model, 4, 16, 2);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ((*c)->free_blocks(), 4);
}

}  // namespace
}  // namespace tessera

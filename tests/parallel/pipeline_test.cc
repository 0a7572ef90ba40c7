// Pipeline schedules, stage partitioning, shard slices, and a two-stage GPT
// whose stages are driven by hand (no communicator) against the whole model.
#include "parallel/pipeline.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "comm/local/self_communicator.h"
#include "nn/gpt.h"
#include "parallel/model_parallel.h"
#include "tensor/slice.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::backward_or_die;
using testing_util::forward_or_die;
using testing_util::make_gpt;
using testing_util::reserve_activations_or_die;

std::string ops_str(const std::vector<PipeOp>& ops) {
  std::string s;
  for (const PipeOp& op : ops) s += (op.forward ? "F" : "B") + std::to_string(op.micro) + " ";
  return s;
}

TEST(PipelineSchedule, OneFOneBWarmsUpByStagesToGo) {
  EXPECT_EQ(ops_str(pipeline_ops(PipelineSchedule::k1F1B, 4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(ops_str(pipeline_ops(PipelineSchedule::k1F1B, 4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  EXPECT_EQ(ops_str(pipeline_ops(PipelineSchedule::k1F1B, 4, 1, 2)), "F0 F1 B0 B1 ");
  EXPECT_EQ(pipeline_slots(PipelineSchedule::k1F1B, 4, 0, 6), 4);
  EXPECT_EQ(pipeline_slots(PipelineSchedule::k1F1B, 4, 2, 6), 2);
  EXPECT_EQ(pipeline_slots(PipelineSchedule::k1F1B, 4, 0, 2), 2);
}

TEST(PipelineSchedule, GPipeRunsAllForwardsFirst) {
  EXPECT_EQ(ops_str(pipeline_ops(PipelineSchedule::kGPipe, 2, 1, 3)), "F0 F1 F2 B0 B1 B2 ");
  EXPECT_EQ(pipeline_slots(PipelineSchedule::kGPipe, 2, 1, 3), 3);
}

TEST(PipelineSchedule, EveryMicroBatchOnceAndBackwardsInOrder) {
  for (auto s : {PipelineSchedule::k1F1B, PipelineSchedule::kGPipe})
    for (int p = 1; p <= 5; p++)
      for (int stage = 0; stage < p; stage++)
        for (int m = 1; m <= 9; m++) {
          int f = 0, b = 0;
          for (const PipeOp& op : pipeline_ops(s, p, stage, m)) {
            if (op.forward) {
              EXPECT_EQ(op.micro, f++);
            } else {
              EXPECT_EQ(op.micro, b++);
              EXPECT_LT(op.micro, f);  // backward after its forward
            }
          }
          EXPECT_EQ(f, m);
          EXPECT_EQ(b, m);
        }
}

// pipeline_slots() is a closed form: it must equal the most micro-batches
// in flight when the schedule is walked.
TEST(PipelineSchedule, SlotsEqualTheMostInFlight) {
  for (auto s : {PipelineSchedule::k1F1B, PipelineSchedule::kGPipe})
    for (int p = 1; p <= 6; p++)
      for (int stage = 0; stage < p; stage++)
        for (int m = 1; m <= 12; m++) {
          int in_flight = 0, most = 0;
          for (const PipeOp& op : pipeline_ops(s, p, stage, m)) {
            in_flight += op.forward ? 1 : -1;
            most = std::max(most, in_flight);
          }
          EXPECT_EQ(pipeline_slots(s, p, stage, m), most) << "p=" << p << " stage=" << stage << " m=" << m;
        }
}

// The largest step is computed op by op, not listed (issue #18 item 1: a
// list of 2 * 1e9 ops was OOM-killed): its count, slots and last ops.
TEST(PipelineSchedule, LargestStepNeedsNoList) {
  const int m = kMaxMicroBatches;
  EXPECT_EQ(pipeline_op_count(m), 2 * int64_t{m});
  EXPECT_EQ(pipeline_slots(PipelineSchedule::k1F1B, 4, 0, m), 4);
  EXPECT_EQ(pipeline_slots(PipelineSchedule::kGPipe, 4, 0, m), m);
  const int64_t last = pipeline_op_count(m) - 1;
  for (auto s : {PipelineSchedule::k1F1B, PipelineSchedule::kGPipe}) {
    PipeOp op = pipeline_op(s, 4, 1, m, last);
    EXPECT_FALSE(op.forward);
    EXPECT_EQ(op.micro, m - 1);
  }
  EXPECT_LT(2 * m + 1, 1 << 20);  // below the evaluation tag
}

TEST(PipelineSchedule, ParsesNamesAndRefusesOthers) {
  EXPECT_EQ(*parse_pipeline_schedule("gpipe"), PipelineSchedule::kGPipe);
  auto bad = parse_pipeline_schedule("interleaved");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"interleaved\""), std::string::npos);
}

TEST(StageLayerCounts, BalancedGivesTheFirstStagesTheRemainder) {
  EXPECT_EQ(*stage_layer_counts(10, 4, {}), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(*stage_layer_counts(4, 2, {3, 1}), (std::vector<int>{3, 1}));
  EXPECT_FALSE(stage_layer_counts(2, 3, {}).ok());
  EXPECT_FALSE(stage_layer_counts(4, 2, {4, 0}).ok());
  EXPECT_FALSE(stage_layer_counts(4, 2, {2, 1}).ok());
}

TEST(TensorSlice, GatherThenScatterIsTheIdentityOnTheBlock) {
  // (2, 3, 4, 5) view, block [1,2) x [0,3) x [1,3) x [0,5).
  std::vector<float> global(2 * 3 * 4 * 5);
  for (size_t i = 0; i < global.size(); i++) global[i] = static_cast<float>(i);
  TensorSlice s;
  s.global = {2, 12, 5};
  s.view = {2, 3, 4, 5};
  s.begin = {1, 0, 1, 0};
  s.size = {1, 3, 2, 5};
  std::vector<float> local(s.block_numel());
  gather_block(global.data(), s, local.data());
  EXPECT_EQ(local[0], 1 * 60 + 0 * 20 + 1 * 5 + 0);
  EXPECT_EQ(local[5], 1 * 60 + 0 * 20 + 2 * 5 + 0);
  EXPECT_EQ(local[10], 1 * 60 + 1 * 20 + 1 * 5 + 0);
  std::vector<float> back(global.size(), -1.0f);
  scatter_block(local.data(), s, back.data());
  for (int64_t i = 0; i < s.block_numel(); i++) EXPECT_EQ(local[i], global[static_cast<size_t>(local[i])]);
  int written = 0;
  for (float x : back) written += x >= 0.0f;
  EXPECT_EQ(written, s.block_numel());
}

TEST(ModelShard, HeadsNotDivisibleByTpIsAClearError) {
  GPTConfig c{2, 6, 48, 100, 16};
  ModelShard s;
  s.tp = 4;
  Status st = s.validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("model.heads (6) must be divisible by parallel.tp (4)"), std::string::npos);
}

TEST(ModelShard, TpShardsTileTheWholeModel) {
  // Every element of every tensor is covered exactly once by the tp ranks'
  // blocks (replicated tensors: by each rank).
  GPTConfig c{2, 4, 32, 300, 16};
  for (int id = 0; id < kNumParams; id++) {
    const TensorSlice whole = param_slice(c, ModelShard{}, id);
    std::vector<float> count(param_slice(c, ModelShard{2, 0}, id).global.numel(), 0.0f);
    for (int r = 0; r < 2; r++) {
      ModelShard s{2, r};
      TensorSlice t = param_slice(c, s, id);
      std::vector<float> ones(t.block_numel(), 1.0f), cur(count.size(), 0.0f);
      scatter_block(ones.data(), t, cur.data());
      for (size_t i = 0; i < count.size(); i++) count[i] += cur[i];
    }
    const bool split = id == kWte || id == kQkvW || id == kQkvB || id == kAttProjW || id == kFcW || id == kFcB ||
                       id == kFcProjW;
    for (float n : count) ASSERT_EQ(n, split ? 1.0f : 2.0f) << param_name(id);
    EXPECT_EQ(whole.global.numel(), static_cast<int64_t>(count.size())) << param_name(id);
  }
}

// tp=3 pads the vocabulary further (lcm(128, 3) = 384 rows here against the
// whole model's 128): each shard gets whole's rows of its block, and zero
// past them.
TEST(ModelShard, CopyFromWholeKeepsTheWholeRowsWhenTpPadsTheVocabularyMore) {
  const GPTConfig c{1, 3, 24, 100, 8};
  ASSERT_EQ(c.padded_vocab(1), 128);
  ASSERT_EQ(c.padded_vocab(3), 384);
  auto whole = make_gpt(c, Backend::kRef);
  whole->init_weights(5);
  auto comm = comm::self_communicator();  // never used: no forward here
  const float* w = whole->params().tensor(kWte).f32();
  for (int r = 0; r < 3; r++) {
    auto shard = make_gpt(c, Backend::kRef, ModelShard{3, r}, comm.get());
    copy_from_whole(*whole, *shard);
    const float* s = shard->params().tensor(kWte).f32();
    for (int64_t row = 0; row < 128; row++) {
      const int64_t global = r * 128 + row;
      for (int i = 0; i < c.channels; i++)
        ASSERT_EQ(s[row * c.channels + i], global < 128 ? w[global * c.channels + i] : 0.0f) << r << " " << row;
    }
  }
}

// Two pipeline stages of a 4-layer model, driven by hand, give the whole
// model's loss and gradients: the same kernels in the same order, so the
// loss and the layers' gradients are bit-identical; the tied embedding's
// gradient is the sum of the two stages' parts.
TEST(PipelineStages, TwoStagesByHandMatchTheWholeModel) {
  const GPTConfig c{4, 2, 32, 70, 16};
  const int B = 2, T = 8;
  auto whole = make_gpt(c, Backend::kRef);
  whole->init_weights(7);
  auto s0 = make_gpt(c, Backend::kRef, ModelShard{1, 0, 0, 3});
  auto s1 = make_gpt(c, Backend::kRef, ModelShard{1, 0, 3, 4});
  // Sharded init draws the same sequence as the whole model's.
  auto s0_init = make_gpt(c, Backend::kRef, ModelShard{1, 0, 0, 3});
  s0_init->init_weights(7);
  copy_from_whole(*whole, *s0);
  copy_from_whole(*whole, *s1);
  ASSERT_EQ(0, std::memcmp(s0->params().base(), s0_init->params().base(), s0->params().bytes()));

  std::mt19937 rng(3);
  std::vector<int> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) {
    in[i] = static_cast<int>(rng() % c.vocab);
    tg[i] = static_cast<int>(rng() % c.vocab);
  }
  const float want = forward_or_die(*whole, in.data(), tg.data(), B, T);
  backward_or_die(*whole, 0.5f);

  reserve_activations_or_die(*s0, B, T, 1);
  reserve_activations_or_die(*s1, B, T, 1);
  float loss0 = -1.0f, loss1 = -1.0f;
  ASSERT_TRUE(s0->forward_stage(0, in.data(), nullptr, B, T, &loss0).ok());
  std::memcpy(s1->stage_input(0), s0->stage_output(0), sizeof(float) * B * T * c.channels);
  ASSERT_TRUE(s1->forward_stage(0, nullptr, tg.data(), B, T, &loss1).ok());
  EXPECT_EQ(loss1, want);
  ASSERT_TRUE(s1->backward_stage(0, 0.5f).ok());
  std::memcpy(s0->stage_output_grad(), s1->stage_input_grad(0), sizeof(float) * B * T * c.channels);
  ASSERT_TRUE(s0->backward_stage(0, 0.5f).ok());

  for (int id = 0; id < kNumParams; id++) {
    std::vector<float> got(whole->params().tensor(id).numel(), 0.0f);
    for (GPT* s : {s0.get(), s1.get()}) {
      TensorSlice t = param_slice(c, s->shard(), id);
      if (t.block_numel() == 0) continue;
      std::vector<float> part(got.size(), 0.0f);
      scatter_block(s->grads().tensor(id).f32(), t, part.data());
      for (size_t i = 0; i < got.size(); i++) got[i] += part[i];
    }
    const float* ref = whole->grads().tensor(id).f32();
    for (size_t i = 0; i < got.size(); i++) {
      if (id == kWte) {
        ASSERT_NEAR(got[i], ref[i], 1e-6f) << "wte " << i;
      } else {
        ASSERT_EQ(got[i], ref[i]) << param_name(id) << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tessera

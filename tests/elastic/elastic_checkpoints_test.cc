// The elastic job's checkpoint lock follows rank 0 (docs/elastic.md, "Disk
// checkpoints"): a worker that stops being rank 0 (it left its round: a
// failure, a cut, a rejoin under another rank) lets checkpoint.dir's LOCK
// go, so the next rank 0, another process on a shared folder, goes on
// writing the periodic checkpoints. Two ElasticCheckpoints in one process
// stand for two workers: flock locks conflict between open files.
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "ckpt/checkpoint.h"
#include "comm/local/self_communicator.h"
#include "elastic/elastic_checkpoints.h"
#include "nn/gpt.h"
#include "optim/zero.h"
#include "parallel/data_parallel.h"
#include "train/checkpointing.h"

namespace tessera::elastic {
namespace {

struct Worker {
  std::unique_ptr<comm::Communicator> self = comm::self_communicator();
  std::unique_ptr<GPT> model;
  std::unique_ptr<ShardedAdamW> opt;
  std::unique_ptr<ElasticCheckpoints> ckpts;
  Worker(const TrainConfig& c, const std::string& id) {
    model = GPT::create(GPTConfig{1, 2, 32, 64, 16}, Backend::kCPU).value();
    EXPECT_TRUE(model->init_weights(1).ok());
    opt = ShardedAdamW::create(gpt_param_space(*model), gpt_adamw_kernel(*model), *self,
                               ShardedAdamWOptions{0, nullptr})
              .value();
    ckpts = std::make_unique<ElasticCheckpoints>(c, "j", id, *self, nullptr);
  }
  void after_step(int rank, int64_t step) {
    ckpts->after_step(rank, step, *model, *opt);
    ckpts->finish();
  }
};

int64_t latest_step(const std::string& dir) {
  Result<ckpt::Checkpoint> ck = ckpt::Checkpoint::open(dir);
  return ck.ok() ? ck->step() : -1;
}

TEST(ElasticCheckpoints, TheLockFollowsRankZero) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("tessera_elastic_ckpt_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  TrainConfig c;
  c.checkpoint_dir = dir;
  c.checkpoint_every = 5;
  c.checkpoint_keep = 0;
  Worker a(c, "h:1"), b(c, "h:2");

  a.after_step(0, 5);  // a is rank 0 of round 0
  EXPECT_EQ(latest_step(dir), 5);
  EXPECT_TRUE(a.ckpts->holds_lock());
  // a leaves its round (a failure); b is rank 0 of the next one, a rank 1.
  a.ckpts->leave();
  EXPECT_FALSE(a.ckpts->holds_lock());
  b.after_step(0, 10);
  EXPECT_EQ(latest_step(dir), 10) << "the new rank 0 could not take the lock";
  EXPECT_TRUE(b.ckpts->holds_lock());
  // Without a leave(): a worker that is not rank 0 of its round lets it go
  // at its next step.
  a.after_step(1, 11);
  b.after_step(1, 11);
  EXPECT_FALSE(b.ckpts->holds_lock());
  a.after_step(0, 15);
  EXPECT_EQ(latest_step(dir), 15);
  // The fallback save (the job failing below min) lets it go once
  // published: a peer's fallback save waits for it.
  a.ckpts->leave();
  EXPECT_TRUE(b.ckpts->save_now(16, *b.model, *b.opt).ok());
  EXPECT_EQ(latest_step(dir), 16);
  EXPECT_FALSE(b.ckpts->holds_lock());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::elastic

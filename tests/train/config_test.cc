#include "train/config.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "optim/optimizer.h"

namespace tessera {
namespace {

std::string write_config(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kMinimal = "[data]\ntrain = \"x.bin\"\n";

TEST(TrainConfig, DefaultsAndOverrides) {
  auto c = load_train_config(write_config("a.toml", std::string(kMinimal) + "[train]\nlr = 1\nsteps = 7\n"),
                             {"train.lr=0.5", "train.dtype=bf16", "model.layers=3"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FLOAT_EQ(c->opt.lr, 0.5f);
  EXPECT_EQ(c->steps, 7);
  EXPECT_EQ(c->opt.steps, 7);
  EXPECT_EQ(c->dtype, "bf16");
  EXPECT_EQ(c->model.layers, 3);
  EXPECT_EQ(c->micro_batch, TrainConfig{}.micro_batch);
}

TEST(TrainConfig, UnknownKeyNamesTheClosest) {
  auto c = load_train_config(write_config("b.toml", std::string(kMinimal) + "[train]\nwarmpu = 3\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("did you mean 'train.warmup'"), std::string::npos) << c.status().message();
}

TEST(TrainConfig, UnknownSection) {
  auto c = load_train_config(write_config("c.toml", std::string(kMinimal) + "[trian]\nsteps = 3\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("trian.steps"), std::string::npos) << c.status().message();
}

TEST(TrainConfig, WrongTypes) {
  auto c = load_train_config(write_config("d.toml", std::string(kMinimal) + "[train]\nsteps = \"ten\"\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("must be an integer"), std::string::npos);
  c = load_train_config(write_config("e.toml", std::string(kMinimal) + "[train]\nlr = \"fast\"\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("must be a number"), std::string::npos);
  c = load_train_config(write_config("f.toml", std::string(kMinimal) + "[train]\nsteps = 0\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(">= 1"), std::string::npos) << c.status().message();
}

TEST(TrainConfig, SeqBeyondContextAndHeadsNotDividingDim) {
  auto c = load_train_config(write_config("g.toml", kMinimal), {"train.seq=512", "model.context=256"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("context"), std::string::npos);
  c = load_train_config(write_config("h.toml", kMinimal), {"model.heads=3"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("divisible"), std::string::npos);
}

// Values that cannot train are refused when the config is read, with the
// key named, not accepted and run (issue #18, item 8).
TEST(TrainConfig, BetasOutsideZeroToOne) {
  for (const char* set : {"train.beta2=2.0", "train.beta2=1", "train.beta1=1.0"}) {
    auto c = load_train_config(write_config("betas.toml", kMinimal), {set});
    ASSERT_FALSE(c.ok()) << set;
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    EXPECT_NE(c.status().message().find(key + " must be in [0, 1)"), std::string::npos) << c.status().message();
  }
  auto c = load_train_config(write_config("betas.toml", kMinimal), {"train.beta1=0", "train.beta2=0.999"});
  EXPECT_TRUE(c.ok()) << c.status().message();
}

TEST(TrainConfig, WarmupBeyondSteps) {
  auto c = load_train_config(write_config("warmup.toml", kMinimal), {"train.steps=10", "train.warmup=11"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("train.warmup (11) exceeds train.steps (10)"), std::string::npos)
      << c.status().message();
  EXPECT_TRUE(load_train_config(write_config("warmup.toml", kMinimal), {"train.steps=10", "train.warmup=10"}).ok());
}

TEST(TrainConfig, StopAtBeyondSteps) {
  auto c = load_train_config(write_config("stop.toml", kMinimal), {"train.steps=10", "train.stop_at=11"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("train.stop_at (11) exceeds train.steps (10)"), std::string::npos)
      << c.status().message();
  EXPECT_TRUE(load_train_config(write_config("stop.toml", kMinimal), {"train.steps=10", "train.stop_at=10"}).ok());
}

TEST(TrainConfig, EmptyCheckpointDir) {
  auto c = load_train_config(write_config("ckdir.toml", kMinimal), {"checkpoint.dir="});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("checkpoint.dir is empty"), std::string::npos) << c.status().message();
}

// A FIFO as the config file is refused by name; reading it would block.
TEST(TrainConfig, FifoConfigIsRefused) {
  const std::string path = ::testing::TempDir() + "/config_fifo.toml";
  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  auto c = load_train_config(path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is a FIFO, not a regular file"), std::string::npos) << c.status().message();
  std::filesystem::remove(path);
}

TEST(TrainConfig, EveryKeyIsDocumented) {
  std::ifstream in(std::string(TESSERA_TEST_DATA_DIR) + "/../docs/config.md");
  std::stringstream ss;
  ss << in.rdbuf();
  for (const ConfigKeyDoc& d : config_key_docs())
    EXPECT_NE(ss.str().find("`" + d.key + "`"), std::string::npos) << d.key << " is missing from docs/config.md";
}

TEST(LrSchedule, WarmupThenCosineToMinimum) {
  OptimizerConfig c;
  c.lr = 1.0f;
  c.min_lr = 0.1f;
  c.warmup = 4;
  c.steps = 14;
  EXPECT_FLOAT_EQ(lr_at(c, 0), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(c, 3), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(c, 4), 1.0f);
  EXPECT_NEAR(lr_at(c, 9), 0.55f, 1e-6);  // halfway through the decay
  EXPECT_NEAR(lr_at(c, 14), 0.1f, 1e-6);
  EXPECT_NEAR(lr_at(c, 20), 0.1f, 1e-6);  // stays at the floor
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

const char* kDlrm =
    "[model]\nkind = \"dlrm\"\nembedding_dim = 8\nbottom = [32, 8]\ntop = []\ntable_rows = [100]\n"
    "[data]\ntrain = \"x.bin\"\n[train]\nbatch = 64\ntable_optimizer = \"sgd\"\n";

TEST(TrainConfig, DlrmKeysAndTheirAdamWDefaults) {
  auto c = load_train_config(write_config("dlrm1.toml", kDlrm), {"train.beta2=0.99", "model.pooling=mean"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_kind, "dlrm");
  EXPECT_EQ(c->dlrm.embedding_dim, 8);
  EXPECT_EQ(c->dlrm.bottom, (std::vector<int>{32, 8}));
  EXPECT_TRUE(c->dlrm.top.empty());
  EXPECT_EQ(c->dlrm.table_rows, std::vector<int>{100});
  EXPECT_EQ(c->dlrm.pooling, "mean");
  EXPECT_EQ(c->dlrm.batch, 64);
  EXPECT_EQ(c->dlrm.table_optimizer, "sgd");
  EXPECT_FLOAT_EQ(c->opt.lr, 1e-3f) << "DLRM's default, not GPT's";
  EXPECT_FLOAT_EQ(c->opt.weight_decay, 0.0f);
  EXPECT_FLOAT_EQ(c->opt.beta2, 0.99f) << "set: kept";
  auto g = load_train_config(write_config("gpt1.toml", kMinimal), {});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->model_kind, "gpt");
  EXPECT_FLOAT_EQ(g->opt.lr, OptimizerConfig{}.lr);
}

TEST(TrainConfig, DlrmRefusesKeysOfTheOtherKind) {
  auto c = load_train_config(write_config("dlrm2.toml", std::string(kDlrm) + "seq = 64\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'train.seq' is a key of model.kind = \"gpt\""), std::string::npos)
      << c.status().message();
  c = load_train_config(write_config("gpt2.toml", kMinimal), {"train.table_lr=0.1"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'train.table_lr' is a key of model.kind = \"dlrm\""), std::string::npos)
      << c.status().message();
  c = load_train_config(write_config("dlrm3.toml", kDlrm), {"model.bottom=[32, 0]"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("integers in [1,"), std::string::npos) << c.status().message();
  c = load_train_config(write_config("dlrm4.toml", kDlrm), {"model.embedding_dim=16"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("must equal model.embedding_dim (16)"), std::string::npos)
      << c.status().message();
}

}  // namespace
}  // namespace tessera

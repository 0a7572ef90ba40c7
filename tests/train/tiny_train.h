// The tiny GPT training job the trainer's tests run in-process: one layer,
// two heads, C = 16, on the committed reference tokens, in a fresh folder
// under the test temp dir.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "train/config.h"

namespace tessera::testing_util {

// `steps` steps of micro-batch 2 x seq 8, no evaluation; checkpoint.dir is
// a new empty folder named `name` (removed first if it exists).
inline TrainConfig tiny_train_config(const std::string& name, int steps) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  TrainConfig c;
  c.model = GPTConfig{1, 2, 16, 50257, 16};
  c.train_data = std::string(TESSERA_TEST_DATA_DIR) + "/reference/tokens.bin";
  c.micro_batch = 2;
  c.seq = 8;
  c.steps = steps;
  c.eval_every = 0;
  c.checkpoint_dir = dir;
  return c;
}

}  // namespace tessera::testing_util

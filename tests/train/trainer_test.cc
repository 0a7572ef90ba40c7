// run_training records its per-step figures, labelled with the rank, into the
// caller's metrics registry, and the JSONL metrics file keeps its keys.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/mpi/mpi_communicator.h"

namespace tessera {
namespace {

TEST(Trainer, RecordsStepsIntoTheGivenRegistryAndKeepsTheJsonlKeys) {
  const std::string dir = ::testing::TempDir() + "/trainer_test";
  std::filesystem::remove_all(dir);
  TrainConfig c;
  c.model = GPTConfig{1, 2, 16, 50257, 16};
  c.train_data = std::string(TESSERA_TEST_DATA_DIR) + "/reference/tokens.bin";
  c.micro_batch = 2;
  c.seq = 8;
  c.steps = 3;
  c.eval_every = 0;
  c.checkpoint_dir = dir;
  c.metrics = dir + "/metrics.jsonl";
  auto world = comm::self_communicator();
  obs::Registry registry;
  setenv("TESSERA_HOST", "testhost", 1);  // the host label
  Result<TrainSummary> r = run_training(c, *world, nullptr, &registry);
  unsetenv("TESSERA_HOST");
  ASSERT_TRUE(r.ok()) << r.status().message();

  EXPECT_EQ(registry.counter("tessera_train_steps_total", "").value(), 3);
  EXPECT_EQ(registry.counter("tessera_train_tokens_total", "").value(), 3 * 2 * 8);
  EXPECT_EQ(registry.gauge("tessera_train_loss", "").value(), r->last_train_loss);
  const std::string text = registry.render_prometheus();
  EXPECT_NE(text.find("# TYPE tessera_train_step_seconds histogram\n"), std::string::npos) << text;
  // Every series carries the rank's labels.
  EXPECT_NE(text.find("tessera_train_step_seconds_count{dp=\"0\",host=\"testhost\",job=\"tessera\",pp=\"0\","
                      "rank=\"0\",tp=\"0\"} 3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tessera_train_memory_bytes{dp=\"0\",host=\"testhost\",job=\"tessera\",kind=\"params\","
                      "pp=\"0\",rank=\"0\",tp=\"0\"} "),
            std::string::npos)
      << text;

  std::ifstream in(c.metrics);
  std::string line, last;
  int lines = 0;
  while (std::getline(in, line)) {
    last = line;
    lines++;
  }
  EXPECT_EQ(lines, 3);
  nlohmann::json j = nlohmann::json::parse(last);
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += it.key() + " ";
  EXPECT_EQ(keys,
            "bubble_ms comm_ms compute_ms grad_norm loss lr mem_activations_mb mem_grads_mb mem_optimizer_mb "
            "mem_params_mb mfu p2p_ms step step_ms tokens_per_s ");
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["loss"].get<double>(), r->last_train_loss);
}

}  // namespace
}  // namespace tessera

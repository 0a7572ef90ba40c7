// The planner against Tessera's own figures (parameter count, MFU FLOPs,
// memory plan) and its physics (more bandwidth never slower, a bubble that
// shrinks with micro-batches, refusals that name the memory), plus the
// cluster-file errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "nn/gpt.h"
#include "plan/cluster.h"
#include "plan/estimate.h"
#include "plan/hardware.h"
#include "plan/model.h"
#include "plan/sbatch.h"
#include "perf/flops.h"
#include "train/memory_plan.h"

namespace tessera::plan {
namespace {

ModelSpec small() {
  ModelSpec m;
  m.name = "t";
  m.layers = 4, m.heads = 4, m.dim = 256, m.vocab = 50257, m.seq = 128, m.context = 256, m.global_batch = 8;
  return m;
}

std::string write(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / ("tessera_plan_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

Cluster gpus(int nodes, int per_node, const std::string& inter = "infiniband", double gbps = 200, int nics = 8) {
  std::string text = "[node]\ntype = \"A100-80GB\"\ncount = " + std::to_string(nodes) + "\ndevices = " +
                     std::to_string(per_node) + "\nprice_per_hour = 16\n[network]\nintra = \"nvlink3\"\n";
  if (nodes > 1) text += "inter = \"" + inter + "\"\ngbps = " + std::to_string(gbps) + "\nnics = " + std::to_string(nics) + "\n";
  auto c = load_cluster(write("c.toml", text));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

TEST(PlanModel, ParametersAndFlopsMatchTheTrainer) {
  for (auto name : {"gpt2-124m", "gpt2-1.5b"}) {
    ModelSpec m = *model_preset(name);
    GPTConfig c{m.layers, m.heads, m.dim, m.vocab, m.seq};
    EXPECT_EQ(m.parameters(), c.num_parameters()) << name;
    EXPECT_DOUBLE_EQ(m.flops_per_token(), flops_per_token(c, m.seq)) << name;
  }
  EXPECT_NEAR(model_preset("gpt2-124m")->parameters() / 1e6, 124.4, 0.1);
  // The Llama family's presets are the published shapes: their checkpoints' counts.
  EXPECT_EQ(model_preset("llama2-7b")->parameters(), 6738415616);
  EXPECT_EQ(model_preset("llama3-8b")->parameters(), 8030261248);
  EXPECT_EQ(model_preset("tinyllama-1.1b")->parameters(), 1100048384);
  EXPECT_EQ(model_preset("qwen2.5-0.5b")->parameters(), 494032768);
  for (auto name : {"llama2-7b", "llama2-70b", "llama3-8b", "llama3-405b", "qwen2.5-0.5b"}) {
    ModelSpec m = *model_preset(name);
    EXPECT_TRUE(m.validate().ok()) << name;
    EXPECT_DOUBLE_EQ(m.flops_per_token(), flops_per_token(m.shape(), m.seq)) << name;
  }
}

// GQA, SwiGLU and the untied head change what a rank holds and computes as
// they do in the model: Llama 3 8B's 8 key/value heads make its qkv weights
// 1.5C wide instead of 3C, and its untied head adds V x C on the last stage.
TEST(PlanModel, TheLlamaShapeChangesMemoryAndTime) {
  ModelSpec llama = *model_preset("llama3-8b");
  llama.seq = 2048;
  llama.global_batch = 64;
  ModelSpec mha = llama;
  mha.family.kv_heads = 0;  // the same model with 32 key/value heads
  Cluster c = gpus(1, 8);
  const Layout l{1, 1, 8, 1, 1, 64, 0};
  const Estimate g = estimate(Job{llama}, c, l), m = estimate(Job{mha}, c, l);
  const double C = 4096, L = 32;
  // Per tp rank (tp = 8): 2 x (32 - 8) x 128 x C fewer qkv weights per layer.
  EXPECT_NEAR((m.mem_params - g.mem_params) / 4, L * 2 * 24 * 128 * C / 8, 1.0);
  EXPECT_LT(g.compute, m.compute);
  // pp = 2: the last stage holds lm_head, with no tied-embedding all-reduce.
  const Layout p{1, 4, 1, 2, 1, 16, 0};
  ModelSpec tied = llama;
  tied.family.tied_head = true;
  EXPECT_LT(estimate(Job{llama}, c, p).dp_exposed, estimate(Job{tied}, c, p).dp_exposed);
}

TEST(PlanModel, UnknownPresetNamesTheKnownOnes) {
  auto r = model_preset("gpt5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpt2-124m"), std::string::npos);
}

TEST(PlanMemory, StatesMatchTheTrainersMemoryPlan) {
  // Parameters, gradients and ZeRO-1 moments are Tessera's own figures
  // (src/train/memory_plan.cc) for dp, tp and pp layouts; activations are
  // that lower bound plus the logits.
  for (bool llama : {false, true}) {
  ModelSpec m = small();
  if (llama) {  // GQA, SwiGLU, an untied head
    m.family.kv_heads = m.heads / 2;
    m.family.mlp_hidden = 3 * m.dim;
    m.family.norm = Norm::kRMSNorm;
    m.family.positions = Positions::kRope;
    m.family.mlp = Mlp::kSwiGLU;
    m.family.bias = m.family.qkv_bias = m.family.tied_head = false;
  }
  const GPTConfig c = m.shape();
  Cluster cl = gpus(1, 8);
  for (Layout l : {Layout{1, 1, 1, 1, 8, 1, 0}, Layout{1, 2, 1, 1, 4, 1, 1}, Layout{1, 1, 2, 1, 8, 1, 0},
                   Layout{1, 1, 1, 2, 4, 2, 0}}) {
    ModelShard shard;
    shard.tp = l.tp;
    shard.layer_end = m.layers / l.pp;  // the first stage (embeddings, the most layers)
    shard.last = l.pp == 1;
    MemoryPlan want = plan_training_memory(c, shard, l.micro_batch, m.seq, std::min(l.pp, l.grad_accum), l.dp, l.zero, false);
    Estimate e = estimate(Job{m, "fp32"}, cl, l);
    EXPECT_NEAR(e.mem_params, want.params, 0.01 * want.params) << l.str();
    EXPECT_NEAR(e.mem_optimizer, want.optimizer, 0.01 * want.optimizer) << l.str();
    EXPECT_GE(e.mem_activations, want.activations) << l.str();
  }
  }
}

TEST(PlanEstimate, StepAddsUpToItsTerms) {
  Estimate e = estimate(Job{*model_preset("gpt2-350m")}, gpus(2, 8), Layout{2, 4, 2, 2, 4, 16, 1});
  EXPECT_NEAR(e.step, e.compute + e.bubble + e.tp_comm + e.p2p + e.dp_exposed + e.optimizer + e.checkpoint, 1e-9);
  EXPECT_GT(e.compute, 0);
  EXPECT_GT(e.bubble, 0);
  EXPECT_GT(e.tp_comm, 0);
  EXPECT_GT(e.p2p, 0);
  EXPECT_GT(e.mfu, 0.05);
  EXPECT_LT(e.mfu, 1.0);
}

TEST(PlanEstimate, BubbleShrinksWithMicroBatches) {
  ModelSpec m = *model_preset("gpt2-350m");
  Cluster c = gpus(1, 8);
  Estimate few = estimate(Job{m}, c, Layout{1, 1, 1, 8, 8, 8, 0});
  Estimate many = estimate(Job{m}, c, Layout{1, 1, 1, 8, 1, 64, 0});
  EXPECT_GT(few.bubble / few.step, many.bubble / many.step);
}

TEST(PlanEstimate, SlowerNetworkNeverFaster) {
  ModelSpec m = *model_preset("llama2-7b");
  m.global_batch = 512;
  Layout l{2, 2, 8, 1, 1, 256, 1};
  Estimate ib = estimate(Job{m}, gpus(2, 8, "infiniband", 200, 8), l);
  Estimate eth = estimate(Job{m}, gpus(2, 8, "ethernet", 25, 1), l);
  EXPECT_GT(eth.step, ib.step);
  EXPECT_GT(eth.dp_exposed, ib.dp_exposed);
}

TEST(PlanSearch, SevenBFitsOnFourA100sOnlyWithSharding) {
  ModelSpec m = *model_preset("llama2-7b");
  m.global_batch = 512;
  Cluster c = gpus(1, 4);
  auto best = search(Job{m}, c, "time", 3);
  ASSERT_FALSE(best.empty());
  for (const auto& e : best) {
    EXPECT_TRUE(e.fits);
    EXPECT_LE(e.mem_total, e.mem_capacity);
    EXPECT_GT(e.layout.tp * e.layout.pp * (e.layout.zero ? e.layout.dp : 1), 1) << e.layout.str();  // 7B x 16 B does not fit one GPU
  }
  for (size_t i = 1; i < best.size(); ++i) EXPECT_LE(best[i - 1].step, best[i].step);
}

// --emit-sbatch (issue #32 item 6): the job script asks Slurm for what the
// layout uses (nodes, tasks per node, GPUs) and passes the layout, batch and
// shape the plan priced; a layout that does not fit gets no script.
TEST(PlanSbatch, TheScriptAsksForTheLayoutAndPassesIt) {
  ModelSpec m = small();
  m.global_batch = 32;  // dp x mb x ga below
  Cluster c = gpus(2, 8);
  Estimate e = estimate(Job{m}, c, Layout{2, 4, 2, 2, 2, 4, 1});
  ASSERT_TRUE(e.fits) << e.refusal;
  e.train_seconds = 3600;
  SbatchRequest r;
  r.train_config = "my.toml";
  r.steps = 1000;
  r.checkpoint_every = 50;
  Result<std::string> text = sbatch_script(r, m, c, e);
  ASSERT_TRUE(text.ok()) << text.status().message();
  for (const char* want : {"#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=8\n", "#SBATCH --gpus-per-node=8\n",
                           "#SBATCH --signal=USR1@120\n", "#SBATCH --requeue\n", "#SBATCH --time=0-01:29:00\n",
                           "CONFIG=${CONFIG:-my.toml}", "srun --mpi=pmix", "--resume auto",
                           "--set parallel.dp=4 --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero=1",
                           "--set train.micro_batch=2 --set train.grad_accum=4", "--set model.layers=4 --set model.heads=4",
                           "--set train.steps=1000", "--set checkpoint.every=50", "[ \"${SLURM_NTASKS:-0}\" = 16 ]",
                           "if [ $rc -eq 75 ]; then", "if [ $rc -eq 138 ]; then", "scontrol requeue"})
    EXPECT_NE(text->find(want), std::string::npos) << want << "\n" << *text;
  EXPECT_EQ(text->find("--cpus-per-task"), std::string::npos);
  e.fits = false;
  e.refusal = "needs 90 GB";
  Result<std::string> none = sbatch_script(r, m, c, e);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("needs 90 GB"), std::string::npos);
}

TEST(PlanSearch, NothingFitsNamesTheMemory) {
  ModelSpec m = *model_preset("megatron-145b");
  Estimate closest;
  auto best = search(Job{m}, gpus(1, 4), "time", 3, &closest);
  EXPECT_TRUE(best.empty());
  EXPECT_NE(closest.refusal.find("GB per device"), std::string::npos) << closest.refusal;
}

TEST(PlanCluster, ErrorsNameTheFileAndKey) {
  auto missing = load_cluster(write("m.toml", "[node]\ntype = \"A100-80GB\"\nprice_per_hour = 1\n"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("node.count"), std::string::npos);
  auto unknown = load_cluster(write("u.toml", "[node]\ntype = \"B300\"\ncount = 1\nprice_per_hour = 1\n"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown node type 'B300'"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("H100-SXM"), std::string::npos);
  auto net = load_cluster(write("n.toml", "[node]\ntype = \"H100-SXM\"\ncount = 2\nprice_per_hour = 1\n"));
  ASSERT_FALSE(net.ok());
  EXPECT_NE(net.status().message().find("[network]"), std::string::npos);
  EXPECT_FALSE(load_cluster("/nonexistent/c.toml").ok());
}

TEST(PlanHardware, CatalogueEntriesHaveSourcesAndPeaks) {
  for (const auto& name : catalogue_names()) {
    auto n = catalogue_entry(name);
    ASSERT_TRUE(n.ok()) << name;
    EXPECT_FALSE(n->source.empty()) << name;
    EXPECT_GT(n->peak_of("bf16"), 1e12) << name;
    EXPECT_GT(n->memory, 1e9) << name;
    EXPECT_GT(n->mem_bw, 1e10) << name;
    const double small_e = n->gemm_efficiency("bf16", 64, 64, 64), big_e = n->gemm_efficiency("bf16", 8192, 8192, 8192);
    EXPECT_LT(small_e, big_e) << name;
    EXPECT_LE(big_e, 1.0) << name;
  }
}

TEST(PlanHardware, ProfileGemmFiguresAreInterpolated) {
  const std::string p = write("p.json", R"({"schema": "tessera.profile", "version": 1,
    "machine": {"cores": 2, "threads": 2, "figure_threads": 1, "memory_bytes": 25e9},
    "figures": [{"name": "cpu.gemm.fp32.peak", "value": 200},
                {"name": "cpu.gemm.fp32.256x256x256", "value": 100},
                {"name": "cpu.gemm.fp32.1024x1024x1024", "value": 200},
                {"name": "cpu.mem.triad", "value": 10}]})");
  auto n = node_from_profile(p);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_DOUBLE_EQ(n->peak_of("fp32"), 400e9);  // 1 thread's figure x 2 cores
  EXPECT_DOUBLE_EQ(n->mem_bw, 20e9);
  EXPECT_DOUBLE_EQ(n->gemm_efficiency("fp32", 256, 256, 256), 0.5);
  EXPECT_DOUBLE_EQ(n->gemm_efficiency("fp32", 1024, 1024, 1024), 1.0);
  const double mid = n->gemm_efficiency("fp32", 512, 512, 512);
  EXPECT_GT(mid, 0.5);
  EXPECT_LT(mid, 1.0);
  auto bad = node_from_profile(write("b.json", R"({"schema": "other"})"));
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace tessera::plan

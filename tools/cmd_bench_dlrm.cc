// tessera bench dlrm-parallel: model-parallel DLRM training steps
// (parallel/dlrm_parallel.h) on synthetic batches, under mpirun / tessera
// launch for n ranks (without them: one rank). Prints the plan, one JSON line
// per step with the global loss, and a summary (samples/s, lookups/s, the
// all-to-all's share); --dump writes the logical model after the last step
// (rank 0 gathers every shard), so runs at different rank counts and
// placements can be compared (tests/cli/dlrm_parallel.sh). docs/dlrm.md.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/mpi/mpi_communicator.h"
#include "parallel/dlrm_batch.h"
#include "parallel/dlrm_parallel.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct DlrmParallelArgs {
  int tables = 8, rows = 1000, dim = 16, dense = 13, batch = 64, steps = 10, bag = 1;
  std::vector<int> table_rows;  // overrides --tables/--rows
  std::vector<int> bottom = {32, 16}, top = {32, 16};
  std::string pooling = "sum";
  std::string dump;
  double budget_mb = 0;
  uint64_t seed = 1;
  DlrmParallelOptions opts;
};

// Rank 0 writes, as raw little-endian float32: the MLP parameters, then each
// table's rows (E_t, D) in order, then each table's Adagrad state (E_t) (sgd:
// none). The other ranks send their shards (values, then state) to rank 0 in
// the plan's order.
Status dump_model(DlrmParallel& p, comm::Communicator& c, bool adagrad, const std::string& path) {
  const DlrmConfig& cfg = p.config();
  const int64_t D = cfg.dim;
  const DlrmPlan& plan = p.plan();
  if (c.rank() != 0) {
    int tag = 1000;
    for (const DlrmParallel::TableShard& s : p.owned_shards()) {
      const int64_t rows = s.row_end - s.row_begin;
      if (Status st = c.send(s.values, rows * D * 4, 0, tag++); !st.ok()) return st;
      if (s.accum != nullptr)
        if (Status st = c.send(s.accum, rows * 4, 0, tag++); !st.ok()) return st;
    }
    return Status::OK();
  }
  std::vector<std::vector<float>> tables, state;
  for (int e : cfg.table_rows) {
    tables.emplace_back(static_cast<size_t>(e) * D, 0.0f);
    state.emplace_back(e, 0.0f);
  }
  std::vector<int> next_tag(c.size(), 1000);
  std::vector<DlrmParallel::TableShard> mine = p.owned_shards();
  size_t k = 0;
  for (const DlrmShard& s : plan.shards) {
    const int64_t rows = s.row_end - s.row_begin;
    float* values = &tables[s.table][s.row_begin * D];
    float* accum = &state[s.table][s.row_begin];
    if (s.rank == 0) {
      const DlrmParallel::TableShard& m = mine[k++];
      std::copy(m.values, m.values + rows * D, values);
      if (m.accum != nullptr) std::copy(m.accum, m.accum + rows, accum);
      continue;
    }
    if (Status st = c.recv(values, rows * D * 4, s.rank, next_tag[s.rank]++); !st.ok()) return st;
    if (adagrad)
      if (Status st = c.recv(accum, rows * 4, s.rank, next_tag[s.rank]++); !st.ok()) return st;
  }
  std::ofstream f(path, std::ios::binary);
  auto put = [&f](const std::vector<float>& v) {
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  };
  put(p.dense_params());
  for (const auto& t : tables) put(t);
  if (adagrad)
    for (const auto& s : state) put(s);
  f.close();
  if (!f) return Status::IOError(fmt::format("--dump {}: could not write", path));
  return Status::OK();
}

int run(DlrmParallelArgs a) {
  DlrmConfig cfg;
  cfg.num_dense = a.dense;
  cfg.dim = a.dim;
  cfg.bottom = a.bottom;
  cfg.top = a.top;
  cfg.table_rows = a.table_rows.empty() ? std::vector<int>(a.tables, a.rows) : a.table_rows;
  cfg.pooling = a.pooling == "mean" ? Pooling::kMean : Pooling::kSum;
  if (Status st = cfg.validate(); !st.ok()) return usage_error(st.message());
  if (a.batch < 1) return usage_error(fmt::format("--batch {} must be >= 1", a.batch));
  if (a.steps < 1) return usage_error(fmt::format("--steps {} must be >= 1", a.steps));
  if (a.bag < 0) return usage_error(fmt::format("--bag {} must be >= 0", a.bag));
  if (a.budget_mb < 0) return usage_error(fmt::format("--budget-mb {} must be >= 0", a.budget_mb));
  a.opts.table_budget_bytes = static_cast<int64_t>(a.budget_mb * (1 << 20));
  a.opts.lookups_per_sample.assign(cfg.table_rows.size(), static_cast<double>(a.bag));

  auto world = comm::world_communicator();
  if (!world.ok()) return fail(world.status());
  comm::Communicator& c = **world;
  const bool root = c.rank() == 0;
  auto made = DlrmParallel::create(cfg, a.opts, &c, a.seed);
  if (!made.ok()) {
    // Every rank plans alike, so every rank fails alike: one line from rank 0.
    if (root) fail(made.status());
    world->reset();
    comm::mpi_finalize();
    return kExitError;
  }
  DlrmParallel& p = **made;
  if (root) {
    std::printf("# dlrm-parallel: %d rank(s), placement %s, %zu tables, %lld params\n", c.size(),
                p.plan().placement.c_str(), cfg.table_rows.size(),
                static_cast<long long>(p.num_params()));
    const std::string d = describe_plan(p.plan());
    for (size_t i = 0, j; i < d.size(); i = j + 1) {
      j = d.find('\n', i);
      std::printf("# %s\n", d.substr(i, j - i).c_str());
    }
  }
  std::vector<DlrmBatchData> data;
  for (int s = 0; s < a.steps; s++) data.push_back(synthetic_dlrm_batch(cfg, a.batch, a.bag, a.seed * 1000003 + s));
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < a.steps; s++) {
    auto loss = p.train_step(data[s].view());
    if (!loss.ok()) comm::abort_job(loss.status().With(fmt::format("bench dlrm-parallel step {}", s + 1)));
    if (root) std::printf("{\"step\": %d, \"loss\": %.9g}\n", s + 1, *loss);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.dump.empty())
    if (Status st = dump_model(p, c, a.opts.table_optimizer == "adagrad", a.dump); !st.ok()) comm::abort_job(st);
  // Lookups over all ranks.
  int64_t lookups = p.stats().lookups;
  if (Status st = c.all_reduce(&lookups, &lookups, 1, comm::ElemType::kI64); !st.ok()) comm::abort_job(st);
  if (root) {
    const DlrmParallel::Stats& st = p.stats();
    std::printf("{\"summary\": \"dlrm-parallel\", \"ranks\": %d, \"placement\": \"%s\", \"steps\": %d, \"batch\": %d, "
                "\"samples_per_s\": %.1f, \"lookups_per_s\": %.1f, \"alltoall_share\": %.4f, \"rank0_alltoall_s\": "
                "%.6f, \"rank0_lookup_s\": %.6f, \"rank0_mlp_s\": %.6f}\n",
                c.size(), p.plan().placement.c_str(), a.steps, a.batch, a.steps * a.batch / secs, lookups / secs,
                st.alltoall_s / secs, st.alltoall_s, st.lookup_s, st.mlp_s);
  }
  std::fflush(stdout);
  made->reset();
  world->reset();
  comm::mpi_finalize();
  return kExitOk;
}

}  // namespace

void add_bench_dlrm_parallel_command(CLI::App& bench) {
  auto a = std::make_shared<DlrmParallelArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "dlrm-parallel", "Model-parallel DLRM steps on synthetic batches (run under mpirun or tessera launch)");
  cmd->add_option("--tables", a->tables, "number of tables (each --rows rows)");
  cmd->add_option("--rows", a->rows, "rows per table");
  cmd->add_option("--table-rows", a->table_rows, "rows of each table (overrides --tables, --rows)")->delimiter(',');
  cmd->add_option("--dim", a->dim, "embedding dimension D");
  cmd->add_option("--dense", a->dense, "dense features");
  cmd->add_option("--bottom", a->bottom, "bottom MLP sizes (the last must equal --dim)")->delimiter(',');
  cmd->add_option("--top", a->top, "top MLP hidden sizes")->delimiter(',');
  cmd->add_option("--batch", a->batch, "global samples per step (split over the ranks)");
  cmd->add_option("--steps", a->steps, "training steps");
  cmd->add_option("--bag", a->bag, "mean ids per sample per table (bag sizes uniform in [0, 2*bag])");
  cmd->add_option("--pooling", a->pooling, "sum or mean")->check(CLI::IsMember({"sum", "mean"}));
  cmd->add_option("--placement", a->opts.placement, "table, row or auto (the planner)")
      ->check(CLI::IsMember({"table", "row", "auto"}));
  cmd->add_option("--budget-mb", a->budget_mb, "table memory per rank for the planner, MiB (0: unlimited)");
  cmd->add_option("--table-optimizer", a->opts.table_optimizer, "adagrad (row-wise) or sgd")
      ->check(CLI::IsMember({"adagrad", "sgd"}));
  cmd->add_option("--lr", a->opts.lr_dense, "AdamW learning rate of the MLPs");
  cmd->add_option("--table-lr", a->opts.lr_table, "learning rate of the tables");
  cmd->add_option("--seed", a->seed, "initialisation and data seed");
  cmd->add_option("--dump", a->dump, "write the trained model here (raw float32; rank 0)");
  cmd->callback([a] { exit_code() = run(*a); });
}

}  // namespace tessera::tools

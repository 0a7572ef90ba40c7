#include "perf/dlrm_bench.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "kernels/cpu/ops.h"
#include "nn/dlrm.h"
#include "perf/cpu_checks.h"

namespace tessera::perf {

namespace {

using Clock = std::chrono::steady_clock;

// Best wall time of `iters` runs of f (after one untimed run).
template <typename F>
double best_seconds(int iters, F f) {
  f();
  double best = 1e30;
  for (int i = 0; i < iters; i++) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

Result<DlrmOpsResult> bench_dlrm_ops(const DlrmOpsOptions& o) {
  if (o.rows <= 0 || o.rows > (int64_t{1} << 31) - 1)
    return Status::InvalidArgument("--rows must be in [1, 2^31)");
  if (o.tables < 1 || o.batch < 1 || o.ids_per_bag < 1 || o.iters < 1)
    return Status::InvalidArgument("--tables, --batch, --ids-per-bag and --iters must be at least 1");
  DlrmConfig config;
  config.num_dense = o.num_dense;
  config.dim = o.dim;
  config.bottom = o.bottom;
  config.top = o.top;
  config.table_rows.assign(static_cast<size_t>(o.tables), static_cast<int>(o.rows));
  RETURN_IF_ERROR(config.validate());
  std::optional<Dlrm> made;
  try {
    made.emplace(config);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(fmt::format("cannot allocate {} tables of {} rows of dimension {} ({:.1f} GB)",
                                                 o.tables, o.rows, o.dim,
                                                 static_cast<double>(o.tables) * o.rows * o.dim * 4 / 1e9));
  }
  Dlrm& model = *made;
  model.init(o.seed);

  const int B = o.batch, L = o.ids_per_bag, T = o.tables, D = o.dim;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int> row(0, static_cast<int>(o.rows) - 1);
  std::normal_distribution<float> normal;
  std::vector<std::vector<int>> ids(T, std::vector<int>(static_cast<size_t>(B) * L));
  std::vector<int> offsets(B + 1);
  for (int b = 0; b <= B; b++) offsets[b] = b * L;
  for (auto& t : ids)
    for (int& id : t) id = row(rng);
  std::vector<float> dense(static_cast<size_t>(B) * o.num_dense), labels(B);
  for (float& x : dense) x = normal(rng);
  for (int b = 0; b < B; b++) labels[b] = static_cast<float>(b % 2);
  DlrmBatch batch;
  batch.B = B;
  batch.dense = dense.data();
  batch.labels = labels.data();
  for (int t = 0; t < T; t++) batch.ids.push_back(ids[t].data()), batch.offsets.push_back(offsets.data());

  DlrmOpsResult r;
  r.params = model.num_params();
  r.lookups = static_cast<int64_t>(B) * L * T;

  // Lookups: every table's bags into its slot of a (B, T, D) output, as the
  // model lays the features out.
  std::vector<float> pooled(static_cast<size_t>(B) * T * D);
  r.lookup_s = best_seconds(o.iters, [&] {
    for (int t = 0; t < T; t++)
      cpu::embedding_bag_forward(pooled.data() + static_cast<int64_t>(t) * D, static_cast<int64_t>(T) * D,
                                 model.table(t).data(), ids[t].data(), offsets.data(), B, D, config.pooling);
  });
  r.lookup_bytes = static_cast<double>(r.lookups) * D * 4 + static_cast<double>(r.lookups) * 4 +
                   static_cast<double>(T) * (B + 1) * 4 + static_cast<double>(B) * T * D * 4;
  r.lookup_gbps = r.lookup_bytes / r.lookup_s / 1e9;

  // MLPs: every layer's forward and backward at the batch.
  std::vector<std::pair<int, int>> layers;  // (in, out)
  int in = o.num_dense;
  for (int out : o.bottom) layers.push_back({in, out}), in = out;
  in = config.interaction_size();
  for (int out : o.top) layers.push_back({in, out}), in = out;
  layers.push_back({in, 1});
  int widest = 0;
  for (auto [i, out] : layers) widest = std::max({widest, i, out});
  std::vector<float> x(static_cast<size_t>(B) * widest), y(static_cast<size_t>(B) * widest),
      dx(static_cast<size_t>(B) * widest), dy(static_cast<size_t>(B) * widest),
      w(static_cast<size_t>(widest) * widest), dw(w.size()), bias(widest), dbias(widest);
  for (float& v : x) v = normal(rng) * 0.1f;
  for (float& v : w) v = normal(rng) * 0.05f;
  for (float& v : dy) v = normal(rng) * 0.01f;
  r.mlp_s = best_seconds(o.iters, [&] {
    for (auto [i, out] : layers) {
      cpu::matmul_forward(y.data(), x.data(), w.data(), bias.data(), B, i, out, MatmulPrecision::kF32);
      cpu::matmul_backward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), B, i, out,
                           MatmulPrecision::kF32);
    }
  });
  for (auto [i, out] : layers) r.mlp_flops += 6.0 * B * i * out;
  r.mlp_gflops = r.mlp_flops / r.mlp_s / 1e9;

  // Interaction: forward and backward over features laid out as the model's.
  const int F = T + 1, P = F * (F - 1) / 2;
  std::vector<float> feat(static_cast<size_t>(B) * F * D), inter(static_cast<size_t>(B) * (D + P)),
      dinter(inter.size()), dfeat(feat.size());
  for (float& v : feat) v = normal(rng) * 0.1f;
  for (float& v : dinter) v = normal(rng) * 0.01f;
  r.interaction_s = best_seconds(o.iters, [&] {
    cpu::interaction_forward(inter.data(), feat.data(), B, F, D);
    cpu::interaction_backward(dfeat.data(), dinter.data(), feat.data(), B, F, D);
  });
  r.interaction_flops = 6.0 * B * P * D;
  r.interaction_gflops = r.interaction_flops / r.interaction_s / 1e9;

  r.step_s = best_seconds(o.iters, [&] {
    model.zero_dense_grads();
    model.forward(batch);
    model.backward(batch);
  });

  r.triad_gbps = triad_gb_per_s();
  r.gemm_peak_gflops = measure_matmul_gflops(1024, MatmulPrecision::kF32, 3);
  return r;
}

}  // namespace tessera::perf

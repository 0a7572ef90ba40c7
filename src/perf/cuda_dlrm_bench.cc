// `tessera bench dlrm-ops --backend cuda` (perf/dlrm_bench.h): the sparse
// half of a DLRM step with the CUDA kernels on device 0. The device's own
// ceiling for the lookups is a device-to-device copy measured in the same
// run. Built with the CUDA backend only (perf/no_cuda.cc says why not).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/ops.h"
#include "perf/dlrm_bench.h"
#include "runtime/cuda_device.h"

namespace tessera::perf {

namespace {

using Clock = std::chrono::steady_clock;

// Device memory, freed on scope exit.
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { (void)cuda::device_free(ptr_); }
  Status allocate(size_t bytes) {
    Result<void*> p = cuda::device_malloc(std::max<size_t>(bytes, 1));
    if (!p.ok()) return p.status();
    ptr_ = *p;
    return Status::OK();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// Best wall time of `iters` runs of f (after one untimed run), each ending in
// a device synchronize (which also reports a kernel's error).
template <typename F>
Result<double> best_seconds(int iters, F f) {
  f();
  RETURN_IF_ERROR(cuda::synchronize());
  double best = 1e30;
  for (int i = 0; i < iters; i++) {
    const auto t0 = Clock::now();
    f();
    RETURN_IF_ERROR(cuda::synchronize());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

template <typename T>
Status upload(const DeviceArray& dst, const std::vector<T>& src, size_t offset_elems = 0) {
  return cuda::memcpy_h2d(dst.as<T>() + offset_elems, src.data(), src.size() * sizeof(T));
}

}  // namespace

Result<DlrmCudaOpsResult> bench_dlrm_ops_cuda(const DlrmOpsOptions& o) {
  if (o.rows <= 0 || o.rows > (int64_t{1} << 31) - 1)
    return Status::InvalidArgument("--rows must be in [1, 2^31)");
  if (o.tables < 1 || o.batch < 1 || o.ids_per_bag < 1 || o.iters < 1 || o.dim < 1)
    return Status::InvalidArgument("--tables, --batch, --ids-per-bag, --dim and --iters must be at least 1");
  if (static_cast<int64_t>(o.batch) * o.ids_per_bag > (int64_t{1} << 31) - 1)
    return Status::InvalidArgument("--batch x --ids-per-bag must be below 2^31");
  Result<int> n = cuda::query_device_count();
  if (!n.ok()) return Status::Unavailable("no CUDA device: " + n.status().message());
  if (*n == 0) return Status::Unavailable("no CUDA device: the driver reports 0 devices");
  RETURN_IF_ERROR(cuda::set_device(0));

  const int B = o.batch, L = o.ids_per_bag, T = o.tables, D = o.dim, F = T + 1, P = F * (F - 1) / 2;
  const int64_t E = o.rows, BL = static_cast<int64_t>(B) * L;
  DlrmCudaOpsResult r;
  r.device = cuda::device_summary(0);
  r.lookups = BL * T;
  r.table_params = T * E * D;

  // Every table starts as the same host table (U(-sqrt(1/E), sqrt(1/E)), as
  // Dlrm::init); the ids differ per table.
  std::mt19937_64 rng(o.seed);
  std::vector<float> host_table(static_cast<size_t>(E) * D);
  std::uniform_real_distribution<float> init(-std::sqrt(1.0f / E), std::sqrt(1.0f / E));
  for (float& v : host_table) v = init(rng);
  std::uniform_int_distribution<int> row(0, static_cast<int>(E) - 1);
  std::vector<int> host_ids(static_cast<size_t>(BL) * T), host_offsets(B + 1);
  for (int& id : host_ids) id = row(rng);
  for (int b = 0; b <= B; b++) host_offsets[b] = b * L;
  std::normal_distribution<float> normal;
  auto randn = [&](size_t count, float scale) {
    std::vector<float> v(count);
    for (float& x : v) x = normal(rng) * scale;
    return v;
  };

  DeviceArray tables, state, ids, offsets, pooled, dpooled, rows, drows, feat, dfeat, inter, dinter;
  RETURN_IF_ERROR(tables.allocate(static_cast<size_t>(r.table_params) * sizeof(float)));
  RETURN_IF_ERROR(state.allocate(static_cast<size_t>(T) * E * sizeof(float)));
  RETURN_IF_ERROR(ids.allocate(host_ids.size() * sizeof(int)));
  RETURN_IF_ERROR(offsets.allocate(host_offsets.size() * sizeof(int)));
  const size_t pooled_floats = static_cast<size_t>(B) * T * D;
  RETURN_IF_ERROR(pooled.allocate(pooled_floats * sizeof(float)));
  RETURN_IF_ERROR(dpooled.allocate(pooled_floats * sizeof(float)));
  RETURN_IF_ERROR(rows.allocate(static_cast<size_t>(BL) * T * sizeof(int)));
  RETURN_IF_ERROR(drows.allocate(static_cast<size_t>(BL) * T * D * sizeof(float)));
  const size_t feat_floats = static_cast<size_t>(B) * F * D, inter_floats = static_cast<size_t>(B) * (D + P);
  RETURN_IF_ERROR(feat.allocate(feat_floats * sizeof(float)));
  RETURN_IF_ERROR(dfeat.allocate(feat_floats * sizeof(float)));
  RETURN_IF_ERROR(inter.allocate(inter_floats * sizeof(float)));
  RETURN_IF_ERROR(dinter.allocate(inter_floats * sizeof(float)));
  for (int t = 0; t < T; t++) RETURN_IF_ERROR(upload(tables, host_table, static_cast<size_t>(t) * E * D));
  RETURN_IF_ERROR(cuda::memset_zero(state.as<float>(), static_cast<size_t>(T) * E * sizeof(float)));
  RETURN_IF_ERROR(upload(ids, host_ids));
  RETURN_IF_ERROR(upload(offsets, host_offsets));
  RETURN_IF_ERROR(upload(dpooled, randn(pooled_floats, 0.01f)));
  RETURN_IF_ERROR(upload(feat, randn(feat_floats, 0.1f)));
  RETURN_IF_ERROR(upload(dinter, randn(inter_floats, 0.01f)));
  RETURN_IF_ERROR(cuda::memset_zero(dfeat.as<float>(), feat_floats * sizeof(float)));

  auto table_of = [&](int t) { return tables.as<float>() + static_cast<int64_t>(t) * E * D; };
  auto ids_of = [&](int t) { return ids.as<int>() + static_cast<int64_t>(t) * BL; };
  const int64_t ld = static_cast<int64_t>(T) * D;  // (B, T, D), as the CPU bench lays the pooled rows out

  Result<double> s = best_seconds(o.iters, [&] {
    for (int t = 0; t < T; t++)
      cuda::embedding_bag_forward(pooled.as<float>() + static_cast<int64_t>(t) * D, ld, table_of(t), ids_of(t),
                                  offsets.as<int>(), B, D, Pooling::kSum);
  });
  if (!s.ok()) return s.status();
  r.lookup_s = *s;
  r.lookup_bytes = static_cast<double>(r.lookups) * D * 4 + static_cast<double>(r.lookups) * 4 +
                   static_cast<double>(T) * (B + 1) * 4 + static_cast<double>(B) * T * D * 4;
  r.lookup_gbps = r.lookup_bytes / r.lookup_s / 1e9;

  std::vector<int> unique(T, 0);
  s = best_seconds(o.iters, [&] {
    for (int t = 0; t < T; t++)
      unique[t] = cuda::embedding_bag_backward(rows.as<int>() + static_cast<int64_t>(t) * BL,
                                               drows.as<float>() + static_cast<int64_t>(t) * BL * D,
                                               dpooled.as<float>() + static_cast<int64_t>(t) * D, ld, ids_of(t),
                                               offsets.as<int>(), B, D, Pooling::kSum);
  });
  if (!s.ok()) return s.status();
  r.backward_s = *s;
  for (int u : unique) r.unique_rows += u;

  const RowwiseAdagradParams hp{0.01f, 1e-8f};
  s = best_seconds(o.iters, [&] {
    for (int t = 0; t < T; t++)
      cuda::rowwise_adagrad_update(table_of(t), state.as<float>() + static_cast<int64_t>(t) * E,
                                   rows.as<int>() + static_cast<int64_t>(t) * BL,
                                   drows.as<float>() + static_cast<int64_t>(t) * BL * D, unique[t], D, hp);
  });
  if (!s.ok()) return s.status();
  r.adagrad_s = *s;

  s = best_seconds(o.iters, [&] {
    cuda::interaction_forward(inter.as<float>(), feat.as<float>(), B, F, D);
    cuda::interaction_backward(dfeat.as<float>(), dinter.as<float>(), feat.as<float>(), B, F, D);
  });
  if (!s.ok()) return s.status();
  r.interaction_s = *s;

  // The ceiling: a device-to-device copy of up to 256 MiB of the tables
  // into the rest of them (reads and writes: 2 x bytes).
  const size_t half = std::min<size_t>(static_cast<size_t>(r.table_params) * sizeof(float) / 2, size_t{256} << 20);
  Status copied;
  s = best_seconds(o.iters, [&] {
    if (copied.ok()) copied = cuda::memcpy_d2d(tables.as<char>() + half, tables.as<char>(), half);
  });
  if (!s.ok()) return s.status();
  RETURN_IF_ERROR(copied);
  r.copy_gbps = 2.0 * static_cast<double>(half) / *s / 1e9;
  return r;
}

}  // namespace tessera::perf

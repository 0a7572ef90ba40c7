// The recommendation (DLRM) ops on CUDA (kernels/cuda/dlrm.cu) against the
// reference oracle, and the CUDA sparse optimizers against optim/sparse.h's
// CPU updates, on seeded random inputs with the edge cases of the contract:
// empty bags (alone, in a row, last; mean pooling of one), an id repeated
// within a bag and across bags, long runs of one hot id, ids at the table's
// last row, strided outputs, batches with no ids at all.
//
// Sparse SGD keeps the reference's order of float operations, so it must
// equal it bitwise; the other ops are compared by normalised error
// (testing_util). The embedding bag against the oracle (bit for bit), the
// interaction, ReLU and BCE are rows of the shared op table (op_table.h). Backward cases
// pre-fill accumulated gradients with random values, so a kernel that
// overwrites instead of accumulating fails.
//
// Compiled into every build; without TESSERA_HAVE_CUDA, or with it and no
// device, every test is skipped with the reason (scripts/gpu-check.sh runs
// them on a GPU: its cuda-dlrm step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/cuda_device.h"
#include "test_util.h"
#ifdef TESSERA_HAVE_CUDA
#include "kernels/cuda/ops.h"
#include "kernels/ref/ops.h"
#include "optim/sparse.h"
#endif

namespace tessera {
namespace {

#ifndef TESSERA_HAVE_CUDA

TEST(CudaDlrm, SkippedWithoutTheCudaBackend) {
  GTEST_SKIP() << "the CUDA backend is not compiled into this binary";
}

#else

// "" when a device is usable (and made current), else why not.
std::string no_device_reason() {
  const Result<int> n = cuda::query_device_count();
  if (!n.ok()) return n.status().message();
  if (n.value() == 0) return "the driver reports 0 devices";
  const Status st = cuda::set_device(0);
  return st.ok() ? "" : st.message();
}

#define SKIP_WITHOUT_DEVICE()                                          \
  do {                                                                 \
    const std::string reason = no_device_reason();                     \
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device: " << reason; \
  } while (0)

void must(const Status& st) {
  if (!st.ok()) throw std::runtime_error(st.message());  // gtest reports it as a failure
}

// A device copy of a host vector (exactly its size: a read past the end of a
// table is a read past the end of its allocation), freed on scope exit.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    Result<void*> p = cuda::device_malloc(std::max<size_t>(n_, 1) * sizeof(T));
    must(p.status());
    ptr_ = static_cast<T*>(*p);
    if (n_ > 0) must(cuda::memcpy_h2d(ptr_, host.data(), n_ * sizeof(T)));
  }
  ~DeviceVector() { (void)cuda::device_free(ptr_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return ptr_; }
  // Waits for the kernels (surfacing their errors) and copies back.
  std::vector<T> to_host() const {
    std::vector<T> host(n_);
    must(cuda::synchronize());
    if (n_ > 0) must(cuda::memcpy_d2h(host.data(), ptr_, n_ * sizeof(T)));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Bags for B samples over E rows: sizes 0..maxlen; sample 0 repeats an id
// and holds the last row E-1, samples 1 and 2 are empty (two in a row), the
// last is empty; a `hot` share of ids comes from rows 0..3, so some ids run
// long across bags.
void make_bags(std::vector<int>& ids, std::vector<int>& offsets, int B, int E, int maxlen, double hot,
               std::mt19937& rng) {
  std::uniform_int_distribution<int> len(0, maxlen), id(0, E - 1), hot_id(0, std::min(E, 4) - 1);
  std::bernoulli_distribution is_hot(hot);
  offsets.assign(1, 0);
  ids.clear();
  for (int b = 0; b < B; b++) {
    const bool empty = b == 1 || b == 2 || (b == B - 1 && B > 1);
    if (b == 0) {
      const int x = id(rng);
      ids.insert(ids.end(), {x, E - 1, x});
    }
    const int n = empty ? 0 : len(rng);
    for (int k = 0; k < n; k++) ids.push_back(is_hot(rng) ? hot_id(rng) : id(rng));
    offsets.push_back(static_cast<int>(ids.size()));
  }
}

double err(const std::vector<float>& ours, const std::vector<float>& ref) {
  EXPECT_EQ(ours.size(), ref.size());
  return testing_util::normalised_error(ours.data(), ref.data(), static_cast<int64_t>(ref.size()));
}

// Positions where a and b differ in their bits (float == is not enough for -0).
int bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); i++)
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n + static_cast<int>(std::max(a.size(), b.size()) - std::min(a.size(), b.size()));
}

struct SparseGrad {
  int U = 0;
  std::vector<int> rows;
  std::vector<float> drows;
};

SparseGrad ref_backward(const std::vector<float>& dout, int64_t ld, const std::vector<int>& ids,
                        const std::vector<int>& offsets, int B, int D, Pooling pooling) {
  const int L = offsets[B];
  SparseGrad g;
  g.rows.assign(std::max(L, 1), -1);
  g.drows.assign(static_cast<size_t>(std::max(L, 1)) * D, 0.0f);
  g.U = ref::embedding_bag_backward(g.rows.data(), g.drows.data(), dout.data(), ld, ids.data(), offsets.data(), B,
                                    D, pooling);
  g.rows.resize(g.U);
  g.drows.resize(static_cast<size_t>(g.U) * D);
  return g;
}

SparseGrad cuda_backward(const std::vector<float>& dout, int64_t ld, const std::vector<int>& ids,
                         const std::vector<int>& offsets, int B, int D, Pooling pooling) {
  const int L = offsets[B];
  DeviceVector<float> d_dout(dout);
  DeviceVector<int> d_ids(ids), d_offsets(offsets), d_rows(std::vector<int>(L, -1));
  DeviceVector<float> d_drows(std::vector<float>(static_cast<size_t>(L) * D, -7.0f));
  SparseGrad g;
  g.U = cuda::embedding_bag_backward(d_rows.get(), d_drows.get(), d_dout.get(), ld, d_ids.get(), d_offsets.get(), B,
                                     D, pooling);
  g.rows = d_rows.to_host();
  g.drows = d_drows.to_host();
  if (g.U < 0 || g.U > L) return g;  // the caller's ASSERT_EQ on U reports it
  g.rows.resize(g.U);
  g.drows.resize(static_cast<size_t>(g.U) * D);
  return g;
}

class CudaDlrmEmbeddingBag : public ::testing::TestWithParam<Pooling> {};

// The embedding bag against the oracle, bit for bit on odd shapes, is a row
// of the shared op table (op_table.h, AllOps/CudaMatchesRef). Here what only
// the CUDA kernels promise: the sparse backward has no atomics, so a second
// run gives the same bits, also with runs of hundreds of one id.
TEST_P(CudaDlrmEmbeddingBag, BackwardIsDeterministic) {
  SKIP_WITHOUT_DEVICE();
  const Pooling pooling = GetParam();
  std::mt19937 rng(17);
  for (auto [B, E, D, maxlen, hot] : {std::tuple{9, 50, 300, 6, 0.3}, std::tuple{2048, 100000, 64, 20, 0.25}}) {
    SCOPED_TRACE("B=" + std::to_string(B) + " E=" + std::to_string(E) + " D=" + std::to_string(D));
    std::vector<int> ids, offsets;
    make_bags(ids, offsets, B, E, maxlen, hot, rng);
    const int64_t ld = D + 3;
    const std::vector<float> dout = randn(static_cast<size_t>(B) * ld, rng);
    const SparseGrad want = ref_backward(dout, ld, ids, offsets, B, D, pooling);
    const SparseGrad got = cuda_backward(dout, ld, ids, offsets, B, D, pooling);
    ASSERT_EQ(got.U, want.U);
    const SparseGrad again = cuda_backward(dout, ld, ids, offsets, B, D, pooling);
    EXPECT_EQ(again.rows, got.rows);
    EXPECT_EQ(bit_mismatches(again.drows, got.drows), 0) << "backward is deterministic";
  }
}

TEST_P(CudaDlrmEmbeddingBag, BatchesWithNoIds) {
  SKIP_WITHOUT_DEVICE();
  const Pooling pooling = GetParam();
  const int E = 4, D = 5;
  std::mt19937 rng(3);
  const std::vector<float> table = randn(static_cast<size_t>(E) * D, rng);
  DeviceVector<float> d_table(table);
  for (const int B : {0, 1, 6}) {
    SCOPED_TRACE("B=" + std::to_string(B));
    const std::vector<int> offsets(B + 1, 0), no_ids;
    DeviceVector<int> d_offsets(offsets), d_ids(no_ids);
    DeviceVector<float> d_out(std::vector<float>(static_cast<size_t>(B) * D, -1.0f));
    cuda::embedding_bag_forward(d_out.get(), D, d_table.get(), d_ids.get(), d_offsets.get(), B, D, pooling);
    EXPECT_EQ(d_out.to_host(), std::vector<float>(static_cast<size_t>(B) * D, 0.0f)) << "empty bags pool to zeros";
    const std::vector<float> dout = randn(static_cast<size_t>(B) * D, rng);
    EXPECT_EQ(cuda_backward(dout, D, no_ids, offsets, B, D, pooling).U, 0) << "no ids, no gradient rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Pooling, CudaDlrmEmbeddingBag, ::testing::Values(Pooling::kSum, Pooling::kMean),
                         [](const auto& info) { return info.param == Pooling::kSum ? "Sum" : "Mean"; });

// fp32 sums in another order or CUDA's exp/log1p: far below this.
constexpr double kTolerance = 1e-5;

// A table, its Adagrad state and a sparse gradient of distinct rows in no
// particular order (the contract asks only distinct), with rows 0 and E-1.
struct SparseStep {
  int E = 0, D = 0, U = 0;
  std::vector<float> table, state, grads;
  std::vector<int> rows;
};

SparseStep make_step(int E, int D, int U, std::mt19937& rng) {
  SparseStep s;
  s.E = E, s.D = D, s.U = U;
  s.table = randn(static_cast<size_t>(E) * D, rng);
  s.state.resize(E);
  std::uniform_real_distribution<float> pos(0.0f, 2.0f);
  for (float& v : s.state) v = pos(rng);
  std::vector<int> all(E);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin() + 1, all.end() - 1, rng);
  s.rows.assign(all.begin() + 1, all.begin() + 1 + (U - 2));
  s.rows.push_back(E - 1);
  s.rows.push_back(0);
  std::shuffle(s.rows.begin(), s.rows.end(), rng);
  s.grads = randn(static_cast<size_t>(U) * D, rng, 0.1f);
  return s;
}

TEST(CudaDlrm, RowwiseAdagradMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(21);
  for (auto [E, D, U] : {std::tuple{2, 1, 2}, std::tuple{1000, 64, 300}, std::tuple{5000, 33, 5000},
                         std::tuple{100, 300, 40}}) {
    SCOPED_TRACE("E=" + std::to_string(E) + " D=" + std::to_string(D) + " U=" + std::to_string(U));
    SparseStep s = make_step(E, D, U, rng);
    DeviceVector<float> d_table(s.table), d_state(s.state), d_grads(s.grads);
    DeviceVector<int> d_rows(s.rows);
    const RowwiseAdagradParams hp{0.05f, 1e-8f};
    const std::vector<float> before = s.table, state_before = s.state;
    rowwise_adagrad_update(s.table.data(), s.state.data(), s.rows.data(), s.grads.data(), U, D, hp);
    cuda::rowwise_adagrad_update(d_table.get(), d_state.get(), d_rows.get(), d_grads.get(), U, D, hp);
    const std::vector<float> table = d_table.to_host(), state = d_state.to_host();
    EXPECT_LE(err(table, s.table), kTolerance) << "table";
    EXPECT_LE(err(state, s.state), kTolerance) << "state";
    std::vector<bool> touched(E, false);
    for (int r : s.rows) touched[r] = true;
    for (int r = 0; r < E; r++) {
      if (touched[r]) continue;
      ASSERT_EQ(state[r], state_before[r]) << "untouched row " << r;
      for (int d = 0; d < D; d++) ASSERT_EQ(table[static_cast<size_t>(r) * D + d], before[static_cast<size_t>(r) * D + d]);
    }
  }
}

TEST(CudaDlrm, SparseSgdMatchesCpuBitwise) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(23);
  for (auto [E, D, U] : {std::tuple{2, 1, 2}, std::tuple{1000, 64, 300}, std::tuple{100, 300, 40}}) {
    SCOPED_TRACE("E=" + std::to_string(E) + " D=" + std::to_string(D) + " U=" + std::to_string(U));
    SparseStep s = make_step(E, D, U, rng);
    DeviceVector<float> d_table(s.table), d_grads(s.grads);
    DeviceVector<int> d_rows(s.rows);
    sparse_sgd_update(s.table.data(), s.rows.data(), s.grads.data(), U, D, 0.5f);
    cuda::sparse_sgd_update(d_table.get(), d_rows.get(), d_grads.get(), U, D, 0.5f);
    EXPECT_EQ(bit_mismatches(d_table.to_host(), s.table), 0);
  }
}

// One table's sparse step on the device, as a trainer would run it: pool,
// backward to the sparse gradient, row-wise Adagrad on its rows; against the
// same on the host (ref kernels, optim's update).
TEST(CudaDlrm, SparseStepMatchesHost) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(29);
  const int B = 512, E = 2000, D = 32;
  std::vector<int> ids, offsets;
  make_bags(ids, offsets, B, E, 8, 0.2, rng);
  std::vector<float> table = randn(static_cast<size_t>(E) * D, rng), state(E, 0.0f);
  const std::vector<float> dout = randn(static_cast<size_t>(B) * D, rng);
  const RowwiseAdagradParams hp{0.1f, 1e-8f};
  const int L = offsets[B];
  DeviceVector<float> d_table(table), d_state(state), d_dout(dout), d_pooled(std::vector<float>(B * D));
  DeviceVector<float> d_drows(std::vector<float>(static_cast<size_t>(L) * D));
  DeviceVector<int> d_ids(ids), d_offsets(offsets), d_rows{std::vector<int>(L)};
  for (int step = 0; step < 3; step++) {
    const SparseGrad g = ref_backward(dout, D, ids, offsets, B, D, Pooling::kMean);
    rowwise_adagrad_update(table.data(), state.data(), g.rows.data(), g.drows.data(), g.U, D, hp);
    cuda::embedding_bag_forward(d_pooled.get(), D, d_table.get(), d_ids.get(), d_offsets.get(), B, D,
                                Pooling::kMean);
    const int U = cuda::embedding_bag_backward(d_rows.get(), d_drows.get(), d_dout.get(), D, d_ids.get(),
                                               d_offsets.get(), B, D, Pooling::kMean);
    ASSERT_EQ(U, g.U);
    cuda::rowwise_adagrad_update(d_table.get(), d_state.get(), d_rows.get(), d_drows.get(), U, D, hp);
  }
  EXPECT_LE(err(d_table.to_host(), table), kTolerance);
  EXPECT_LE(err(d_state.to_host(), state), kTolerance);
  std::vector<float> pooled_ref(static_cast<size_t>(B) * D);
  ref::embedding_bag_forward(pooled_ref.data(), D, table.data(), ids.data(), offsets.data(), B, D, Pooling::kMean);
  cuda::embedding_bag_forward(d_pooled.get(), D, d_table.get(), d_ids.get(), d_offsets.get(), B, D, Pooling::kMean);
  EXPECT_LE(err(d_pooled.to_host(), pooled_ref), kTolerance);
}

#endif  // TESSERA_HAVE_CUDA

}  // namespace
}  // namespace tessera

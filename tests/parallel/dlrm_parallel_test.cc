// DlrmParallel (parallel/dlrm_parallel.h) against one process's Dlrm: the
// same initial weights (bitwise) and the same training over 10 steps, 1e-5
// relative, for 1, 2 and 4 ranks (Gloo, ranks as threads over loopback),
// table-wise and row-wise, sum and mean pooling, a batch that does not split
// evenly and one smaller than the rank count.
#include "parallel/dlrm_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <thread>

#include "comm/gloo/gloo_communicator.h"
#include "comm/rendezvous/tcp_store.h"
#include "kernels/cpu/ops.h"
#include "optim/sparse.h"
#include "parallel/dlrm_batch.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing_util::normalised_error;

DlrmConfig small_config(Pooling pooling) {
  DlrmConfig c;
  c.num_dense = 5;
  c.dim = 8;
  c.bottom = {12, 8};
  c.top = {16, 8};
  c.table_rows = {50, 7, 120, 33, 9};
  c.pooling = pooling;
  return c;
}

// The whole model, logically: MLPs and every table with its Adagrad state.
struct Snapshot {
  std::vector<float> dense, m, v;
  std::vector<std::vector<float>> tables, accum;
  std::vector<float> losses;
};

// One process: Dlrm with AdamW on the MLPs and row-wise Adagrad on the
// tables, as src/train/dlrm_train.cc does it.
Snapshot train_reference(const DlrmConfig& c, const DlrmParallelOptions& o, const std::vector<DlrmBatchData>& data,
                         uint64_t seed) {
  Dlrm model(c);
  model.init(seed);
  Snapshot s;
  s.m.assign(model.dense_params().size(), 0.0f);
  s.v = s.m;
  for (int e : c.table_rows) s.accum.emplace_back(e, 0.0f);
  int step = 0;
  for (const DlrmBatchData& d : data) {
    const DlrmBatch b = d.view();
    s.losses.push_back(model.forward(b));
    model.zero_dense_grads();
    model.backward(b);
    AdamWParams hp;
    hp.lr = o.lr_dense;
    hp.beta1 = o.beta1;
    hp.beta2 = o.beta2;
    hp.eps = o.eps;
    hp.weight_decay = o.weight_decay;
    hp.t = ++step;
    cpu::adamw_update(model.dense_params().data(), model.dense_grads().data(), s.m.data(), s.v.data(),
                      static_cast<int64_t>(s.m.size()), hp);
    for (size_t t = 0; t < c.table_rows.size(); t++) {
      const SparseRows& g = model.table_grad(static_cast<int>(t));
      if (o.table_optimizer == "adagrad")
        rowwise_adagrad_update(model.table(t).data(), s.accum[t].data(), g.rows.data(), g.grads.data(), g.U, c.dim,
                               {o.lr_table, o.adagrad_eps});
      else
        sparse_sgd_update(model.table(t).data(), g.rows.data(), g.grads.data(), g.U, c.dim, o.lr_table);
    }
  }
  s.dense = model.dense_params();
  for (size_t t = 0; t < c.table_rows.size(); t++) s.tables.push_back(model.table(t));
  return s;
}

// The owned shards of every rank, written into full tables.
void collect_shards(DlrmParallel& p, int D, Snapshot* s, std::mutex* mu) {
  std::lock_guard<std::mutex> lock(*mu);
  for (const DlrmParallel::TableShard& sh : p.owned_shards()) {
    std::copy(sh.values, sh.values + (sh.row_end - sh.row_begin) * D, &s->tables[sh.table][sh.row_begin * D]);
    if (sh.accum != nullptr) std::copy(sh.accum, sh.accum + (sh.row_end - sh.row_begin), &s->accum[sh.table][sh.row_begin]);
  }
}

// Runs f(comm) on n ranks (threads; comm null for n = 0: no communicator).
template <typename F>
void on_ranks(int n, F f) {
  if (n == 0) {
    f(nullptr);
    return;
  }
  auto server = comm::StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  std::vector<std::thread> ts;
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] {
      auto client = comm::StoreClient::connect("127.0.0.1", port, std::chrono::milliseconds(5000));
      ASSERT_TRUE(client.ok());
      comm::CommOptions co;
      co.timeout = std::chrono::milliseconds(30000);
      auto c = comm::make_gloo_communicator(**client, "dlrm/", r, n, "127.0.0.1", co);
      ASSERT_TRUE(c.ok()) << c.status().message();
      // Gloo's connect returns when this rank's pairs are up, a peer's may
      // still be finishing: a rank that ends at once (a refused batch) must
      // not close its sockets under it. Likewise before the teardown.
      ASSERT_TRUE((*c)->barrier().ok());
      f(c->get());
      ASSERT_TRUE((*c)->barrier().ok());
    });
  for (auto& t : ts) t.join();
}

Snapshot train_parallel(int ranks, const DlrmConfig& c, const DlrmParallelOptions& o,
                        const std::vector<DlrmBatchData>& data, uint64_t seed, int steps_before_collect = -1) {
  Snapshot s;
  for (int e : c.table_rows) {
    s.tables.emplace_back(static_cast<size_t>(e) * c.dim, NAN);
    s.accum.emplace_back(e, NAN);
  }
  std::mutex mu;
  on_ranks(ranks, [&](comm::Communicator* comm) {
    auto p = DlrmParallel::create(c, o, comm, seed);
    ASSERT_TRUE(p.ok()) << p.status().message();
    std::vector<float> losses;
    const int steps = steps_before_collect < 0 ? static_cast<int>(data.size()) : steps_before_collect;
    for (int i = 0; i < steps; i++) {
      auto loss = (*p)->train_step(data[i].view());
      ASSERT_TRUE(loss.ok()) << loss.status().message();
      losses.push_back(*loss);
    }
    collect_shards(**p, c.dim, &s, &mu);
    std::lock_guard<std::mutex> lock(mu);
    if (comm == nullptr || comm->rank() == 0) {
      s.losses = losses;
      s.dense = (*p)->dense_params();
      s.m = (*p)->adam_m();
      s.v = (*p)->adam_v();
    } else {
      // Every rank reports the same loss and holds the same MLPs.
      EXPECT_EQ(losses.size(), static_cast<size_t>(steps));
    }
  });
  return s;
}

void expect_same(const Snapshot& ref, const Snapshot& got, double tol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); i++)
    EXPECT_LE(std::abs(got.losses[i] - ref.losses[i]), tol * std::abs(ref.losses[i])) << what << " step " << i;
  EXPECT_LE(normalised_error(got.dense.data(), ref.dense.data(), ref.dense.size()), tol) << what << " dense";
  EXPECT_LE(normalised_error(got.m.data(), ref.m.data(), ref.m.size()), tol) << what << " adam m";
  for (size_t t = 0; t < ref.tables.size(); t++) {
    EXPECT_LE(normalised_error(got.tables[t].data(), ref.tables[t].data(), ref.tables[t].size()), tol)
        << what << " table " << t;
    EXPECT_LE(normalised_error(got.accum[t].data(), ref.accum[t].data(), ref.accum[t].size()), tol)
        << what << " adagrad state " << t;
  }
}

std::vector<DlrmBatchData> batches(const DlrmConfig& c, int B, int steps) {
  std::vector<DlrmBatchData> out;
  for (int i = 0; i < steps; i++) out.push_back(synthetic_dlrm_batch(c, B, 2, 100 + i));
  return out;
}

TEST(DlrmParallel, InitEqualsDlrmInitBitwise) {
  const DlrmConfig c = small_config(Pooling::kSum);
  Dlrm ref(c);
  ref.init(7);
  for (const char* placement : {"table", "row"}) {
    DlrmParallelOptions o;
    o.placement = placement;
    const Snapshot s = train_parallel(3, c, o, {}, 7, 0);
    EXPECT_EQ(s.dense, ref.dense_params()) << placement;
    for (size_t t = 0; t < c.table_rows.size(); t++) EXPECT_EQ(s.tables[t], ref.table(t)) << placement << " " << t;
  }
}

TEST(DlrmParallel, OneProcessWithoutCommunicatorTrainsLikeDlrm) {
  const DlrmConfig c = small_config(Pooling::kSum);
  DlrmParallelOptions o;
  const auto data = batches(c, 13, 10);
  const Snapshot ref = train_reference(c, o, data, 3);
  expect_same(ref, train_parallel(0, c, o, data, 3), 1e-6, "1 process");
}

TEST(DlrmParallel, TwoAndFourRanksTrainLikeOneTableAndRowWise) {
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    const DlrmConfig c = small_config(pooling);
    const auto data = batches(c, 13, 10);  // 13 = 7 + 6 = 4 + 3 + 3 + 3: uneven
    DlrmParallelOptions o;
    const Snapshot ref = train_reference(c, o, data, 5);
    for (int ranks : {2, 4})
      for (const char* placement : {"table", "row", "auto"}) {
        o.placement = placement;
        const std::string what = std::to_string(ranks) + " ranks " + placement +
                                 (pooling == Pooling::kSum ? " sum" : " mean");
        expect_same(ref, train_parallel(ranks, c, o, data, 5), 1e-5, what);
      }
  }
}

TEST(DlrmParallel, SgdOnTheTablesTrainsLikeOneProcess) {
  const DlrmConfig c = small_config(Pooling::kSum);
  const auto data = batches(c, 10, 6);
  DlrmParallelOptions o;
  o.table_optimizer = "sgd";
  o.lr_table = 0.1f;
  Snapshot ref = train_reference(c, o, data, 11);
  o.placement = "row";
  Snapshot got = train_parallel(3, c, o, data, 11);
  for (auto& a : got.accum) std::fill(a.begin(), a.end(), 0.0f);  // no state for sgd: owned_shards' accum is null
  expect_same(ref, got, 1e-5, "sgd 3 ranks row");
}

TEST(DlrmParallel, BatchSmallerThanTheRankCount) {
  const DlrmConfig c = small_config(Pooling::kSum);
  const auto data = batches(c, 3, 4);  // rank 3 of 4 has no sample
  DlrmParallelOptions o;
  o.placement = "row";
  expect_same(train_reference(c, o, data, 9), train_parallel(4, c, o, data, 9), 1e-5, "B=3 on 4 ranks");
}

TEST(DlrmParallel, PredictGathersTheWholeBatchsLogits) {
  const DlrmConfig c = small_config(Pooling::kMean);
  const DlrmBatchData d = synthetic_dlrm_batch(c, 11, 3, 42);
  Dlrm ref(c);
  ref.init(4);
  ref.forward(d.view());
  const std::vector<float> want = ref.logits();
  DlrmParallelOptions o;
  o.placement = "row";
  on_ranks(3, [&](comm::Communicator* comm) {
    auto p = DlrmParallel::create(c, o, comm, 4);
    ASSERT_TRUE(p.ok());
    std::vector<float> logits;
    ASSERT_TRUE((*p)->predict(d.view(), &logits).ok());
    ASSERT_EQ(logits.size(), want.size());
    EXPECT_LE(normalised_error(logits.data(), want.data(), want.size()), 1e-6);
    EXPECT_GT((*p)->stats().lookups, 0);
  });
}

TEST(DlrmParallel, BadBatchIsAnErrorOnEveryRank) {
  const DlrmConfig c = small_config(Pooling::kSum);
  DlrmBatchData d = synthetic_dlrm_batch(c, 5, 2, 1);
  ASSERT_FALSE(d.ids[1].empty());
  d.ids[1][0] = 7;  // table 1 has 7 rows
  on_ranks(2, [&](comm::Communicator* comm) {
    auto p = DlrmParallel::create(c, {}, comm, 1);
    ASSERT_TRUE(p.ok());
    auto loss = (*p)->train_step(d.view());
    ASSERT_FALSE(loss.ok());
    EXPECT_NE(loss.status().message().find("table 1: id 7 at position 0 is outside [0, 7)"), std::string::npos)
        << loss.status().message();
  });
}

TEST(DlrmParallel, BadOptionsAreErrors) {
  const DlrmConfig c = small_config(Pooling::kSum);
  DlrmParallelOptions o;
  o.table_optimizer = "adam";
  auto p = DlrmParallel::create(c, o, nullptr, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("'adam' must be adagrad or sgd"), std::string::npos);
  o = {};
  o.placement = "diagonal";
  p = DlrmParallel::create(c, o, nullptr, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("'diagonal'"), std::string::npos);
}

}  // namespace
}  // namespace tessera

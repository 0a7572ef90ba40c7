// The DLRM model (nn/dlrm.h) against PyTorch: tests/reference/dlrm_reference.json
// (make_dlrm_reference.py: nn.EmbeddingBag, nn.Linear) holds a tiny DLRM's
// weights, a batch (an empty bag, duplicate ids), its logits, loss, every
// dense gradient, the touched rows' gradients of every table, and 10 steps of
// SGD on the MLPs with row-wise Adagrad or SGD on the tables.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/dlrm.h"
#include "optim/sparse.h"
#include "test_util.h"

namespace tessera {
namespace {

const std::string kFile = std::string(TESSERA_TEST_DATA_DIR) + "/reference/dlrm_reference.json";
constexpr double kTol = 2e-5;  // fp32, as the GPT parity tests
using testing_util::normalised_error;

nlohmann::json load() {
  std::ifstream f(kFile);
  EXPECT_TRUE(f.good()) << kFile;
  return nlohmann::json::parse(f);
}

std::vector<float> floats(const nlohmann::json& j) { return j.get<std::vector<float>>(); }

DlrmConfig config_of(const nlohmann::json& c) {
  DlrmConfig cfg;
  cfg.num_dense = c["num_dense"];
  cfg.dim = c["dim"];
  cfg.bottom = c["bottom"].get<std::vector<int>>();
  cfg.top = c["top"].get<std::vector<int>>();
  cfg.table_rows = c["table_rows"].get<std::vector<int>>();
  cfg.pooling = c["pooling"] == "mean" ? Pooling::kMean : Pooling::kSum;
  return cfg;
}

// The model with the reference's weights, and the batch's storage.
struct Fixture {
  nlohmann::json ref;
  std::unique_ptr<Dlrm> model;
  std::vector<float> dense, labels;
  std::vector<std::vector<int>> ids, offsets;
  DlrmBatch batch;

  Fixture() : ref(load()) {
    model = std::make_unique<Dlrm>(config_of(ref["config"]));
    const auto& b = ref["batch"];
    dense = floats(b["dense"]);
    labels = floats(b["labels"]);
    ids = b["ids"].get<std::vector<std::vector<int>>>();
    offsets = b["offsets"].get<std::vector<std::vector<int>>>();
    batch.B = ref["B"];
    batch.dense = dense.data();
    batch.labels = labels.data();
    for (size_t t = 0; t < ids.size(); t++) {
      batch.ids.push_back(ids[t].data());
      batch.offsets.push_back(offsets[t].data());
    }
    set_params(ref["params"], ref["tables"]);
  }

  // Each named dense tensor's place in the model's flat buffer.
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> named() {
    std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> out;
    auto add = [&](const char* name, const std::vector<DlrmLinear>& layers) {
      for (size_t k = 0; k < layers.size(); k++) {
        const DlrmLinear& l = layers[k];
        const std::string p = std::string(name) + "." + std::to_string(k);
        out.push_back({p + ".weight", {l.w, static_cast<int64_t>(l.in) * l.out}});
        out.push_back({p + ".bias", {l.b, l.out}});
      }
    };
    add("bottom", model->bottom_layers());
    add("top", model->top_layers());
    return out;
  }

  void set_params(const nlohmann::json& params, const nlohmann::json& tables) {
    for (const auto& [name, span] : named()) {
      const std::vector<float> v = floats(params.at(name));
      ASSERT_EQ(static_cast<int64_t>(v.size()), span.second) << name;
      std::copy(v.begin(), v.end(), model->dense_params().begin() + span.first);
    }
    for (size_t t = 0; t < tables.size(); t++) {
      model->table(t) = floats(tables[t]);
      ASSERT_EQ(model->table(t).size(), static_cast<size_t>(model->config().table_rows[t] * model->config().dim));
    }
  }
};

TEST(DlrmParity, LogitsLossAndEveryGradient) {
  Fixture f;
  const float loss = f.model->forward(f.batch);
  EXPECT_NEAR(loss, f.ref["loss"].get<double>(), kTol * f.ref["loss"].get<double>());
  const std::vector<float> ref_logits = floats(f.ref["logits"]);
  ASSERT_EQ(f.model->logits().size(), ref_logits.size());
  EXPECT_LE(normalised_error(f.model->logits().data(), ref_logits.data(), ref_logits.size()), kTol);

  f.model->zero_dense_grads();
  f.model->backward(f.batch);
  for (const auto& [name, span] : f.named()) {
    const std::vector<float> ref = floats(f.ref["grads"].at(name));
    EXPECT_LE(normalised_error(f.model->dense_grads().data() + span.first, ref.data(), span.second), kTol) << name;
  }
  for (size_t t = 0; t < f.ids.size(); t++) {
    const SparseRows& g = f.model->table_grad(t);
    const auto& r = f.ref["table_grads"][t];
    EXPECT_EQ(g.rows, r["rows"].get<std::vector<int>>()) << "table " << t << ": the touched rows";
    const std::vector<float> ref = floats(r["grads"]);
    ASSERT_EQ(g.grads.size(), ref.size());
    EXPECT_LE(normalised_error(g.grads.data(), ref.data(), ref.size()), kTol) << "table " << t;
  }
}

void run_steps(const std::string& table_opt) {
  Fixture f;
  const auto& s = f.ref["steps"];
  const float lr_dense = s["lr_dense"], lr_table = s["lr_table"], eps = s["eps"];
  const int steps = s["count"];
  const auto& want = s[table_opt];
  std::vector<std::vector<float>> state;
  for (int e : f.model->config().table_rows) state.emplace_back(e, 0.0f);
  for (int step = 0; step < steps; step++) {
    const float loss = f.model->forward(f.batch);
    const double ref_loss = want["losses"][step];
    // Errors compound over steps; 5x the single-step tolerance, as for GPT.
    EXPECT_NEAR(loss, ref_loss, 5 * kTol * ref_loss) << table_opt << " step " << step;
    f.model->zero_dense_grads();
    f.model->backward(f.batch);
    std::vector<float>& p = f.model->dense_params();
    const std::vector<float>& g = f.model->dense_grads();
    for (size_t i = 0; i < p.size(); i++) p[i] -= lr_dense * g[i];
    for (size_t t = 0; t < f.ids.size(); t++) {
      const SparseRows& sg = f.model->table_grad(t);
      const int D = f.model->config().dim;
      if (table_opt == "adagrad")
        rowwise_adagrad_update(f.model->table(t).data(), state[t].data(), sg.rows.data(), sg.grads.data(), sg.U, D,
                               {lr_table, eps});
      else
        sparse_sgd_update(f.model->table(t).data(), sg.rows.data(), sg.grads.data(), sg.U, D, lr_table);
    }
  }
  for (const auto& [name, span] : f.named()) {
    const std::vector<float> ref = floats(want["params"].at(name));
    EXPECT_LE(normalised_error(f.model->dense_params().data() + span.first, ref.data(), span.second), 5 * kTol)
        << table_opt << " " << name;
  }
  for (size_t t = 0; t < f.ids.size(); t++) {
    const std::vector<float> ref = floats(want["tables"][t]);
    EXPECT_LE(normalised_error(f.model->table(t).data(), ref.data(), ref.size()), 5 * kTol) << "table " << t;
    if (table_opt == "adagrad") {
      const std::vector<float> ref_state = floats(want["state"][t]);
      EXPECT_LE(normalised_error(state[t].data(), ref_state.data(), ref_state.size()), 5 * kTol) << "state " << t;
    }
  }
}

TEST(DlrmParity, TenStepsRowwiseAdagradTables) { run_steps("adagrad"); }
TEST(DlrmParity, TenStepsSgdTables) { run_steps("sgd"); }

TEST(DlrmConfig, ValidateNamesTheBadField) {
  DlrmConfig c;
  c.dim = 8;
  c.bottom = {16, 4};
  c.table_rows = {10};
  const Status s = c.validate();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("must equal dim"), std::string::npos) << s.message();
  c.bottom = {16, 8};
  EXPECT_TRUE(c.validate().ok());
  c.table_rows = {0};
  EXPECT_FALSE(c.validate().ok());
}

}  // namespace
}  // namespace tessera

// DLRM (Naumov et al. 2019), single process on the CPU: docs/dlrm.md.
//
//   dense (B,Nd) -> bottom MLP (ReLU after every layer) -> x (B,D)
//   table t: ids of each sample (a bag) -> embedding_bag -> e_t (B,D)
//   feat (B,F,D) = [x, e_0 .. e_{T-1}], F = 1+T -> interaction -> z (B, D+P)
//   z -> top MLP (ReLU after every layer but the last) -> logit (B)
//   loss = mean over the batch of BCE-with-logits(logit, label)
//
// Letters: B batch, Nd dense features, D embedding dimension, T tables, F =
// 1+T features, P = F(F-1)/2 pairs, E_t rows of table t.
//
// Ownership: a Dlrm owns its parameters (the MLPs' in one flat buffer, the
// tables one buffer each), their gradients (dense: flat, accumulated with +=
// by backward; tables: the sparse gradient of the last backward) and the
// activations of the last forward (resized to the batch, kept for backward).
// Not thread-safe; one batch at a time. Kernels: kernels/cpu (matmul through
// oneDNN, fp32).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/precision.h"

namespace tessera {

struct DlrmConfig {
  int num_dense = 13;            // Nd
  int dim = 16;                  // D
  std::vector<int> bottom;       // bottom MLP output sizes; the last must be D
  std::vector<int> top;          // top MLP hidden sizes; a final layer to 1 logit is added
  std::vector<int> table_rows;   // E_t of each table (T = size)
  Pooling pooling = Pooling::kSum;
  // An error naming the first bad field (sizes <= 0, bottom's last != dim).
  Status validate() const;
  int num_features() const { return 1 + static_cast<int>(table_rows.size()); }
  int interaction_size() const;  // D + P
};

// One batch. ids[t], offsets[t]: table t's bags (ops.inc: offsets (B+1)).
struct DlrmBatch {
  int B = 0;
  const float* dense = nullptr;   // (B,Nd)
  std::vector<const int*> ids;     // T pointers
  std::vector<const int*> offsets; // T pointers, (B+1) each
  const float* labels = nullptr;  // (B), in [0,1]; null: forward computes no loss
};

// One linear layer's place in the flat MLP parameter buffer: weight (out,in)
// at w, bias (out) at b.
struct DlrmLinear {
  int in = 0, out = 0;
  int64_t w = 0, b = 0;
};

// The sparse gradient of one table: U distinct rows (ascending) and their
// (U,D) gradients.
struct SparseRows {
  int U = 0;
  std::vector<int> rows;
  std::vector<float> grads;
};

// The dense half of a DLRM: the bottom MLP, the interaction, the top MLP and
// the loss, over a batch whose pooled embeddings the caller supplies in
// feat() (features 1..T). Dlrm runs it around its tables; a model-parallel
// DLRM (parallel/dlrm_parallel.h) runs it on each rank's slice of samples
// with embeddings pooled on other ranks. Owns the MLPs' flat parameters and
// gradients and the activations of the last forward. Not thread-safe.
class DlrmDense {
 public:
  explicit DlrmDense(const DlrmConfig& config);  // config must validate(); weights zero

  // The DLRM reference's initialisation of the MLPs from rng (bottom layers,
  // then top layers): weights N(0, sqrt(2/(in+out))), biases N(0, sqrt(1/out)).
  void init(std::mt19937_64& rng);

  // Bottom MLP on dense (B,Nd): feat() is resized to (B,F,D) and its feature
  // 0 written; features 1..T are the caller's to write before forward_top.
  void forward_bottom(const float* dense, int B);
  // Interaction and top MLP over feat(): logits() (B).
  void forward_top();
  // Sum over the batch of BCE-with-logits(logits(), labels (B)), in double.
  double loss_sum(const float* labels);
  // Gradients of dloss * sum of the batch's losses (dloss = 1/B: of the mean
  // loss): dense_grads() +=, dfeat() (B,F,D) written (features 1..T are the
  // pooled embeddings' gradients). After forward_top with the same dense.
  void backward(const float* dense, const float* labels, float dloss);
  void zero_grads();

  int batch() const { return batch_; }
  const std::vector<DlrmLinear>& bottom_layers() const { return bottom_; }
  const std::vector<DlrmLinear>& top_layers() const { return top_; }
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  std::vector<float>& grads() { return grads_; }
  std::vector<float>& feat() { return feat_; }         // (B,F,D)
  const std::vector<float>& dfeat() const { return dfeat_; }  // (B,F,D)
  const std::vector<float>& logits() const { return logits_; }

 private:
  DlrmConfig config_;
  std::vector<DlrmLinear> bottom_, top_;
  std::vector<float> params_, grads_;
  // Activations of the last forward: per layer its pre-activation and output.
  std::vector<std::vector<float>> bottom_pre_, bottom_out_, top_pre_, top_out_;
  std::vector<float> feat_, z_, logits_, losses_;
  std::vector<float> dout_, dpre_, din_, dfeat_;  // backward()'s buffers, reused
  int batch_ = 0;
};

class Dlrm {
 public:
  explicit Dlrm(DlrmConfig config);  // config must validate(); weights zero

  // The DLRM reference's initialisation from `seed`: weights N(0, sqrt(2/(in+out))),
  // biases N(0, sqrt(1/out)), table rows U(-sqrt(1/E), sqrt(1/E)), drawn from
  // one mt19937_64 in that order (bottom, top, tables 0..T-1 row-major).
  void init(uint64_t seed);

  // Runs the batch; returns the mean loss (0 without labels). logits() holds (B).
  float forward(const DlrmBatch& batch);
  // Gradients of forward's mean loss: dense_grads() += , table_grad(t) replaced.
  // Call after forward with the same batch (labels required).
  void backward(const DlrmBatch& batch);
  void zero_dense_grads() { dense_.zero_grads(); }

  const DlrmConfig& config() const { return config_; }
  const std::vector<DlrmLinear>& bottom_layers() const { return dense_.bottom_layers(); }
  const std::vector<DlrmLinear>& top_layers() const { return dense_.top_layers(); }
  std::vector<float>& dense_params() { return dense_.params(); }
  std::vector<float>& dense_grads() { return dense_.grads(); }
  std::vector<float>& table(int t) { return tables_[t]; }
  const SparseRows& table_grad(int t) const { return table_grads_[t]; }
  const std::vector<float>& logits() const { return dense_.logits(); }
  int64_t num_params() const;

 private:
  DlrmConfig config_;
  DlrmDense dense_;
  std::vector<std::vector<float>> tables_;
  std::vector<SparseRows> table_grads_;
};

}  // namespace tessera

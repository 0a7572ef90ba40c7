#pragma once

namespace tessera {

// What a matmul's inputs are rounded to. Accumulation is always fp32.
enum class MatmulPrecision { kF32, kBF16 };

// How an embedding bag pools the rows of its ids (ops.inc: embedding_bag_*).
enum class Pooling { kSum, kMean };

// Hyper-parameters of one AdamW update (decoupled weight decay, as
// torch.optim.AdamW). t is the 1-based step used for bias correction;
// grad_scale multiplies every gradient first (global-norm clipping).
struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int t = 1;
  float grad_scale = 1.0f;
};

// Hyper-parameters of row-wise Adagrad on embedding rows (optim/sparse.h,
// and kernels/cuda's rowwise_adagrad_update).
struct RowwiseAdagradParams {
  float lr = 0.01f;
  float eps = 1e-8f;
};

}  // namespace tessera

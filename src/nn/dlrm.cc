#include "nn/dlrm.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/check.h"
#include "kernels/cpu/ops.h"

namespace tessera {

Status DlrmConfig::validate() const {
  if (num_dense <= 0) return Status::InvalidArgument("dlrm: num_dense must be > 0");
  if (dim <= 0) return Status::InvalidArgument("dlrm: dim must be > 0");
  if (bottom.empty()) return Status::InvalidArgument("dlrm: bottom MLP needs at least one layer");
  for (int s : bottom)
    if (s <= 0) return Status::InvalidArgument("dlrm: bottom MLP sizes must be > 0");
  if (bottom.back() != dim)
    return Status::InvalidArgument("dlrm: the bottom MLP's last size (" + std::to_string(bottom.back()) +
                                   ") must equal dim (" + std::to_string(dim) + ")");
  for (int s : top)
    if (s <= 0) return Status::InvalidArgument("dlrm: top MLP sizes must be > 0");
  for (int e : table_rows)
    if (e <= 0) return Status::InvalidArgument("dlrm: table rows must be > 0");
  return Status::OK();
}

int DlrmConfig::interaction_size() const {
  const int F = num_features();
  return dim + F * (F - 1) / 2;
}

DlrmDense::DlrmDense(const DlrmConfig& config) : config_(config) {
  TESSERA_CHECK(config_.validate().ok());
  int64_t off = 0;
  auto add = [&off](std::vector<DlrmLinear>& layers, int in, int out) {
    DlrmLinear l{in, out, off, off + static_cast<int64_t>(in) * out};
    off = l.b + out;
    layers.push_back(l);
  };
  int in = config_.num_dense;
  for (int s : config_.bottom) {
    add(bottom_, in, s);
    in = s;
  }
  in = config_.interaction_size();
  for (int s : config_.top) {
    add(top_, in, s);
    in = s;
  }
  add(top_, in, 1);
  params_.assign(off, 0.0f);
  grads_.assign(off, 0.0f);
  bottom_pre_.resize(bottom_.size());
  bottom_out_.resize(bottom_.size());
  top_pre_.resize(top_.size());
  top_out_.resize(top_.size());
}

void DlrmDense::init(std::mt19937_64& rng) {
  auto init_layers = [&](const std::vector<DlrmLinear>& layers) {
    for (const DlrmLinear& l : layers) {
      std::normal_distribution<float> w(0.0f, std::sqrt(2.0f / static_cast<float>(l.in + l.out)));
      std::normal_distribution<float> b(0.0f, std::sqrt(1.0f / static_cast<float>(l.out)));
      for (int64_t i = 0; i < static_cast<int64_t>(l.in) * l.out; i++) params_[l.w + i] = w(rng);
      for (int i = 0; i < l.out; i++) params_[l.b + i] = b(rng);
    }
  };
  init_layers(bottom_);
  init_layers(top_);
}

void DlrmDense::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void DlrmDense::forward_bottom(const float* dense, int B) {
  const int D = config_.dim, F = config_.num_features();
  batch_ = B;
  const float* in = dense;
  for (size_t l = 0; l < bottom_.size(); l++) {
    const DlrmLinear& L = bottom_[l];
    bottom_pre_[l].resize(static_cast<size_t>(B) * L.out);
    bottom_out_[l].resize(static_cast<size_t>(B) * L.out);
    cpu::matmul_forward(bottom_pre_[l].data(), in, &params_[L.w], &params_[L.b], B, L.in, L.out,
                        MatmulPrecision::kF32);
    cpu::relu_forward(bottom_out_[l].data(), bottom_pre_[l].data(), static_cast<int64_t>(B) * L.out);
    in = bottom_out_[l].data();
  }
  feat_.resize(static_cast<size_t>(B) * F * D);
  for (int b = 0; b < B; b++) std::copy(in + static_cast<int64_t>(b) * D, in + static_cast<int64_t>(b + 1) * D,
                                        &feat_[static_cast<size_t>(b) * F * D]);
}

void DlrmDense::forward_top() {
  const int B = batch_, D = config_.dim, F = config_.num_features();
  const int Z = config_.interaction_size();
  z_.resize(static_cast<size_t>(B) * Z);
  cpu::interaction_forward(z_.data(), feat_.data(), B, F, D);
  const float* in = z_.data();
  for (size_t l = 0; l < top_.size(); l++) {
    const DlrmLinear& L = top_[l];
    top_pre_[l].resize(static_cast<size_t>(B) * L.out);
    cpu::matmul_forward(top_pre_[l].data(), in, &params_[L.w], &params_[L.b], B, L.in, L.out,
                        MatmulPrecision::kF32);
    if (l + 1 < top_.size()) {
      top_out_[l].resize(static_cast<size_t>(B) * L.out);
      cpu::relu_forward(top_out_[l].data(), top_pre_[l].data(), static_cast<int64_t>(B) * L.out);
      in = top_out_[l].data();
    }
  }
  logits_ = top_pre_.back();
}

double DlrmDense::loss_sum(const float* labels) {
  const int B = batch_;
  losses_.resize(B);
  cpu::bce_logits_forward(losses_.data(), logits_.data(), labels, B);
  double sum = 0.0;
  for (float l : losses_) sum += l;
  return sum;
}

void DlrmDense::backward(const float* dense, const float* labels, float dloss) {
  const int B = batch_, D = config_.dim, F = config_.num_features();
  std::vector<float>& dout = dout_;
  std::vector<float>& dpre = dpre_;
  std::vector<float>& din = din_;
  dout.assign(B, 0.0f);
  cpu::bce_logits_backward(dout.data(), logits_.data(), labels, dloss, B);
  // Top MLP, last layer first. dout is the gradient of the layer's output
  // (for the last layer, of the logits; otherwise of its ReLU output).
  for (int l = static_cast<int>(top_.size()) - 1; l >= 0; l--) {
    const DlrmLinear& L = top_[l];
    if (l + 1 < static_cast<int>(top_.size())) {
      dpre.assign(static_cast<size_t>(B) * L.out, 0.0f);
      cpu::relu_backward(dpre.data(), top_pre_[l].data(), dout.data(), static_cast<int64_t>(B) * L.out);
    } else {
      dpre = dout;
    }
    const float* inp = l > 0 ? top_out_[l - 1].data() : z_.data();
    din.assign(static_cast<size_t>(B) * L.in, 0.0f);
    cpu::matmul_backward(din.data(), &grads_[L.w], &grads_[L.b], dpre.data(), inp, &params_[L.w], B, L.in, L.out,
                         MatmulPrecision::kF32);
    dout.swap(din);
  }
  // dout is dz (B, D+P).
  dfeat_.assign(static_cast<size_t>(B) * F * D, 0.0f);
  cpu::interaction_backward(dfeat_.data(), dout.data(), feat_.data(), B, F, D);
  // Bottom MLP: its output's gradient is feature 0 of dfeat.
  dout.resize(static_cast<size_t>(B) * D);
  for (int b = 0; b < B; b++)
    std::copy(&dfeat_[static_cast<size_t>(b) * F * D], &dfeat_[static_cast<size_t>(b) * F * D + D],
              &dout[static_cast<size_t>(b) * D]);
  for (int l = static_cast<int>(bottom_.size()) - 1; l >= 0; l--) {
    const DlrmLinear& L = bottom_[l];
    dpre.assign(static_cast<size_t>(B) * L.out, 0.0f);
    cpu::relu_backward(dpre.data(), bottom_pre_[l].data(), dout.data(), static_cast<int64_t>(B) * L.out);
    const float* inp = l > 0 ? bottom_out_[l - 1].data() : dense;
    if (l > 0) {
      din.assign(static_cast<size_t>(B) * L.in, 0.0f);
      cpu::matmul_backward(din.data(), &grads_[L.w], &grads_[L.b], dpre.data(), inp, &params_[L.w], B, L.in,
                           L.out, MatmulPrecision::kF32);
      dout.swap(din);
    } else {
      cpu::matmul_backward(nullptr, &grads_[L.w], &grads_[L.b], dpre.data(), inp, &params_[L.w], B, L.in, L.out,
                           MatmulPrecision::kF32);
    }
  }
}

Dlrm::Dlrm(DlrmConfig config) : config_(std::move(config)), dense_(config_) {
  for (int e : config_.table_rows) tables_.emplace_back(static_cast<size_t>(e) * config_.dim, 0.0f);
  table_grads_.resize(config_.table_rows.size());
}

void Dlrm::init(uint64_t seed) {
  std::mt19937_64 rng(seed);
  dense_.init(rng);
  for (size_t t = 0; t < tables_.size(); t++) {
    const float a = std::sqrt(1.0f / static_cast<float>(config_.table_rows[t]));
    std::uniform_real_distribution<float> u(-a, a);
    for (float& x : tables_[t]) x = u(rng);
  }
}

int64_t Dlrm::num_params() const {
  int64_t n = static_cast<int64_t>(dense_.params().size());
  for (const auto& t : tables_) n += static_cast<int64_t>(t.size());
  return n;
}

float Dlrm::forward(const DlrmBatch& batch) {
  const int B = batch.B, D = config_.dim, F = config_.num_features(), T = F - 1;
  TESSERA_CHECK(static_cast<int>(batch.ids.size()) == T && static_cast<int>(batch.offsets.size()) == T);
  dense_.forward_bottom(batch.dense, B);
  std::vector<float>& feat = dense_.feat();
  for (int t = 0; t < T; t++)
    cpu::embedding_bag_forward(&feat[static_cast<size_t>(1 + t) * D], static_cast<int64_t>(F) * D,
                               tables_[t].data(), batch.ids[t], batch.offsets[t], B, D, config_.pooling);
  dense_.forward_top();
  if (batch.labels == nullptr || B == 0) return 0.0f;
  return static_cast<float>(dense_.loss_sum(batch.labels) / B);
}

void Dlrm::backward(const DlrmBatch& batch) {
  const int B = dense_.batch(), D = config_.dim, F = config_.num_features(), T = F - 1;
  TESSERA_CHECK(batch.B == B && batch.labels != nullptr);
  dense_.backward(batch.dense, batch.labels, 1.0f / static_cast<float>(B));
  const std::vector<float>& dfeat = dense_.dfeat();
  for (int t = 0; t < T; t++) {
    SparseRows& g = table_grads_[t];
    const int L = batch.offsets[t][B];
    g.rows.resize(L);
    g.grads.resize(static_cast<size_t>(L) * D);
    g.U = cpu::embedding_bag_backward(g.rows.data(), g.grads.data(), &dfeat[static_cast<size_t>(1 + t) * D],
                                      static_cast<int64_t>(F) * D, batch.ids[t], batch.offsets[t], B, D,
                                      config_.pooling);
    g.rows.resize(g.U);
    g.grads.resize(static_cast<size_t>(g.U) * D);
  }
}

}  // namespace tessera

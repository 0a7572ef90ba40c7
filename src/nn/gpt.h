// The decoder: a pre-norm transformer whose shape model/decoder.h describes.
// GPT-2 (layernorm, learned positions, tied embedding, 4C GELU MLP,
// multi-head attention; llm.c's train_gpt2.c layout) and the Llama family
// (RMSNorm, rotary positions, SwiGLU, grouped-query attention, untied head,
// optional qkv biases) are configurations of this one class. Dimension
// letters as in model/decoder.h, plus B batch and T time.
//
// Model parallelism (docs/parallel.md): a GPT may hold only a shard of the
// model, described by a ModelShard: tensor parallelism splits heads, MLP
// columns and the vocabulary tp ways (Megatron-LM), pipeline parallelism
// gives each stage a contiguous range of layers, the first stage the
// embeddings and the last the final norm and the (tied) output head. A rank's
// tensors are blocks of the whole model's (param_slice()); the default shard
// is the whole model. tp > 1 needs the tp communicator; its all-reduces run
// inside forward_stage()/backward_stage(), which is why those return Status.
//
// Ownership: a GPT owns its weights (the parameter arena, laid out by
// param_layout()) and, made for training (ModelUse::kTraining), a gradient
// arena of the same layout, so either can be treated as a flat buffer
// (global norm, all-reduce, checkpoint) or as named tensors. The AdamW
// moments (m, v) are not the model's: optim/optimizer.h's AdamW allocates
// and owns them, on the model's device (optim/zero.h's ShardedAdamW, which
// the trainer uses, holds one AdamW: all the moments, or its ZeRO-1 shard).
// A model made for inference holds only the weights plus the activations
// its forward needs. Training activations are sized on the first try_forward()
// for (B, T) and re-laid only if a later call needs more; forward_tokens'
// scratch grows to the largest ragged batch seen. Steady-state steps
// allocate nothing. Not thread-safe: one step at a time.
//
// One forward: every transformer block runs through layer_forward(), for
// training (dense causal attention over (B,T), activations kept per layer
// for backward) and for inference (forward_tokens: a ragged batch through a
// paged KV cache). Per-layer views (LayerParams, and the activations'
// LayerActs in gpt.cc) hold the only offset arithmetic.
//
// Backend::kCUDA keeps all three arenas on the CUDA device current at
// construction (create() returns backend_available()'s error without one):
// params(), grads() and the raw pointers below are then device pointers. Token ids go in as host
// arrays, the loss comes back as a host float, and try_logits()/try_losses() copy
// back to host buffers; everything else stays on the device. Tensor
// parallelism (tp > 1) is CPU-only for now (its vocabulary-parallel pieces
// are host loops); pipeline stages work on either device. On CUDA the
// attention keeps only what its kernels need between forward and backward
// (OpsTable::attention_saved_floats: one log-sum-exp per row with flash
// attention) and the output layer is chunked (set_head_chunk_rows()):
// logits exist for at most head_chunk_rows() rows at a time, and backward
// recomputes them chunk by chunk (docs/gpu.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/precision.h"
#include "kernels/q4_type.h"
#include "model/decoder.h"
#include "nn/ops_table.h"
#include "tensor/arena.h"
#include "tensor/slice.h"

namespace tessera::comm {
class Communicator;
}

namespace tessera {

class PagedKVCache;

// The decoder configuration (model/decoder.h), named for its first instance.
using GPTConfig = DecoderConfig;

struct ParamPtrs {
  float* p[kNumParams];
  float* operator[](int i) const { return p[i]; }
};

// One layer's tensors inside the stacked (L, ...) parameter (or gradient)
// tensors, for local layer l of a shard: QKVl = (NH+2KV)*hs/tp, Ql =
// NH*hs/tp, Fl = F/tp, FCl = Fl or SwiGLU's 2Fl. A tensor the configuration
// lacks (a bias, a layernorm bias under RMSNorm), or whose p[id] is null, is
// null.
struct LayerParams {
  float *ln1w, *ln1b;          // (C)
  float *qkvw, *qkvb;          // (QKVl, C), (QKVl)
  float *attprojw, *attprojb;  // (C, Ql), (C)
  float *ln2w, *ln2b;          // (C)
  float *fcw, *fcb;            // (FCl, C), (FCl)
  float *fcprojw, *fcprojb;    // (C, Fl), (C)
};
LayerParams layer_view(const ParamPtrs& p, const GPTConfig& c, const ModelShard& s, int l);

// What a GPT is for. kInference allocates the weights and what the forward
// needs, no gradients (backward is then a bug). kInt8Inference is the INT8
// tier's model: the fp32 tensors of the per-layer matmuls and of an untied
// head are not allocated at all (they are laid out with no elements); the
// matrices come in through load_int8() (the loaders quantize each tensor as
// they read it, or read a quantized file), so fp32 copies of all the
// weights never exist (issue #30 item 3). CPU, whole models only.
enum class ModelUse { kTraining, kInference, kInt8Inference };

// A ragged batch for GPT::forward_tokens, N tokens in host memory: token i
// is at position pos[i] of the PagedKVCache sequence seq[i]. Tokens of one
// sequence may be a prefill chunk or a single decode step; rows of
// different sequences mix freely.
struct TokenBatch {
  std::span<const int> tokens;  // (N) ids in [0, V)
  std::span<const int> seq;     // (N) live cache sequence ids
  std::span<const int> pos;     // (N) positions < cache.length(seq[i])
};

// Told during GPT::backward_stage() (and try_backward()) as parameter
// gradients become final, so data parallelism can start reducing them while
// backward goes on. Events, in order: kFinalNorm (lnfw, lnfb and an untied
// head's lmhead), each layer L-1 ... 0 (its 12 per-layer tensors, some
// empty for the Llama family),
// then kEmbeddings (wte, which also holds a tied output layer's gradient, and
// wpe). A pipeline stage raises only its own: kFinalNorm on the last stage,
// its layers, and kEmbeddings on the first and (for its copy of a tied wte)
// the last stage, at the end of its backward. Called on the backward thread;
// keep it short.
class GradListener {
 public:
  static constexpr int kFinalNorm = -1;
  static constexpr int kEmbeddings = -2;
  virtual ~GradListener() = default;
  virtual void on_grads_ready(int what) = 0;  // a layer index or a constant above
};

class GPT {
 public:
  // A model with its parameters (and, for training, gradients) allocated
  // and zeroed. tp_comm (not owned, outlives the GPT) is required when
  // shard.tp > 1, with rank shard.tp_rank. ModelUse::kInference: no
  // gradient arena (grads() is empty). Errors, nothing allocated:
  // InvalidArgument for a config or shard that does not validate (their
  // message) or tp > 1 off the CPU or without tp_comm; Unavailable for a
  // backend this process cannot run (backend_available()) or a device that
  // fails; ResourceExhausted for memory the host or device cannot give (the
  // arena's message: what, its size and the device).
  static Result<std::unique_ptr<GPT>> create(const GPTConfig& config, Backend backend = Backend::kCPU,
                                             const ModelShard& shard = {}, comm::Communicator* tp_comm = nullptr,
                                             ModelUse use = ModelUse::kTraining);

  const GPTConfig& config() const { return config_; }
  const ModelShard& shard() const { return shard_; }
  bool whole() const { return shard_.tp == 1 && shard_.first && shard_.last && local_layers_ == config_.layers; }
  void set_precision(MatmulPrecision p) { prec_ = p; }
  MatmulPrecision precision() const { return prec_; }
  // The INT8 CPU tier (kernels/ops.inc, matmul_int8_forward): quantizes the
  // weights of every matmul (qkv, attention projection, MLP, the output
  // layer: wte or lm_head) once, symmetric per output channel, and from then
  // on the forward runs those matmuls in int8 with activations quantized per
  // row; embeddings, norms and attention stay fp32. The fp32 parameters are
  // kept (export, eval). Inference models on the CPU, whole (tp 1) only:
  // InvalidArgument otherwise. Adds about a quarter of the fp32 weights.
  Status quantize_int8();
  bool int8() const { return int8_ != nullptr; }
  // After quantize_int8 or load_int8: gives the pages of the fp32 weights of
  // the per-layer matmuls (qkv, attention projection, MLP: about 70% of
  // GPT-2's fp32 weights) back to the system (madvise MADV_DONTNEED), for a
  // server that only runs the INT8 forward. Biases, norms, the embeddings
  // and the output layer's fp32 copy stay. From then on the
  // fp32 matmul weights read as zeros: no export, eval or fp32 forward.
  // Returns the bytes given back; InvalidArgument before quantizing.
  // An kInt8Inference model has none to give: 0.
  Result<int64_t> release_fp32_matmul_weights();
  // The token embeddings as a GGUF file's quantized rows (llama.cpp's Q8_0,
  // Q4_0 or Q4_K blocks; V rows of C values) in place of the fp32 table,
  // whose pages are given back as above: both forwards look up the rows a
  // batch needs and dequantize them, the same values the table held when it
  // was read from the same blocks, so the logits do not change. For a
  // quantized inference model on the CPU (fp32 matmul weights released, so
  // nothing quantizes from the table again); InvalidArgument otherwise or
  // when rows is not V rows. TinyLlama's int8 tier: 262 MB of fp32 table
  // -> 70 MB of Q8_0 rows.
  enum class RowFormat { kQ8_0, kQ4_0, kQ4_K };
  Status set_quantized_embeddings(RowFormat format, std::vector<uint8_t> rows);
  bool quantized_embeddings() const { return !embed_rows_.empty(); }
  // Released, or never held (kInt8Inference): the fp32 matmul weights are
  // not there to read (export and quantize_int8 refuse).
  bool fp32_matmul_weights_released() const { return fp32_released_; }
  // Bytes release_fp32_matmul_weights() gave back (0 before).
  int64_t released_bytes() const { return released_bytes_; }
  // Quantizes one (OC, C) fp32 matrix as quantize_int8() does (symmetric
  // per output row): the fill of a load_int8() that reads fp32 tensors.
  void quantize_matrix_int8(const float* src, int OC, int C, int8_t* w, float* scale) const;
  // Bytes of the INT8 weights and their scales (0 before quantize_int8()).
  int64_t int8_bytes() const;
  // The INT8 matrices by index: 4*l + {qkv, attproj, fc, fcproj} for layer
  // l, then 4*L for the output layer ((Vp, C): padded rows included). Each is
  // (OC, C) int8, row-major, with OC scales. load_int8 makes the model INT8
  // from matrices that fill() writes (from a file: docs/formats/int8.md);
  // the same conditions as quantize_int8(). for_each_int8 reads them.
  Status load_int8(const std::function<Status(int index, int OC, int C, int8_t* w, float* scale)>& fill);
  void for_each_int8(const std::function<void(int index, int OC, int C, const int8_t* w, const float* scale)>& f)
      const;
  // The int4 tiers (kernels/q4.h: llama.cpp's Q4_0 and Q4_K blocks): the
  // same matrices as quantize_int8, in 4-bit blocks along the input
  // channels, run by matmul_q4_forward. A Q4_K model's matrices whose input
  // channels are not a multiple of 256 are Q4_0 (as llama.cpp falls back);
  // input channels not a multiple of 32 are refused (InvalidArgument). The
  // same conditions as quantize_int8; a model is INT8 or int4, not both.
  // Returns a line naming the types used ("q4_k: 48 matrices, q4_0: 1").
  Result<std::string> quantize_q4(q4::Type type);
  bool int4() const { return q4_ != nullptr; }
  // Quantized by either tier: the forward reads no fp32 matmul weight.
  bool quantized() const { return int8_ != nullptr || q4_ != nullptr; }
  // Bytes of the int4 blocks (0 before quantize_q4()).
  int64_t q4_bytes() const;
  // The bytes a decode step's matmuls stream, as stored: the INT8 codes and
  // scales or the int4 blocks when quantized, else the whole fp32 parameter
  // arena (host models only; empty on a device). Valid while the model
  // lives and is not quantized again (tessera bench decode reads them to
  // measure the read roof).
  std::vector<std::span<const uint8_t>> stored_weights() const;
  // One int4 matrix as load_q4 takes it and for_each_q4 gives it: OC rows of
  // q4::row_bytes(type, C) bytes. in_perm, when not empty, is a gather of
  // the matmul's input columns (C entries: column c of the stored matrix
  // multiplies input column in_perm[c]): a GGUF file's attention projection
  // whose columns are in Hugging Face's head order where a 256-wide Q4_K
  // block cannot be moved whole (nn/gguf_model.h).
  struct Q4Matrix {
    q4::Type type = q4::Type::kQ4_0;
    std::vector<uint8_t> w;
    std::vector<int32_t> in_perm;
  };
  // The int4 matrices by index, as load_int8's. load_q4 makes the model
  // int4 from matrices that fill() writes (fill sets the type, sizes w and
  // may set in_perm; a size that does not match is an error); the same
  // conditions as quantize_q4(), and the blocks' scales are checked
  // (q4::check_row). for_each_q4 reads them.
  Status load_q4(const std::function<Status(int index, int OC, int C, Q4Matrix* m)>& fill);
  void for_each_q4(const std::function<void(int index, int OC, int C, const Q4Matrix& m)>& f) const;
  Backend backend() const { return backend_; }
  Device device() const { return device_; }

  Arena& params() { return params_; }
  Arena& grads() { return grads_; }
  const Arena& params() const { return params_; }
  ParamPtrs param_ptrs() const { return ptrs(params_); }
  ParamPtrs grad_ptrs() const { return ptrs(grads_); }
  bool training() const { return use_ == ModelUse::kTraining; }
  // Local layer l's parameters (gradients) as views into the stacked tensors.
  // (null for the matmul weights of a kInt8Inference model).
  LayerParams layer_params(int l) const;
  LayerParams layer_grads(int l) const { return layer_view(grad_ptrs(), config_, shard_, l); }
  // Whether AdamW decays this tensor (2-D weights only).
  static bool decays(int param_id);

  // Whether this rank's copy of a tensor counts towards the global gradient
  // norm: replicated tensors count on tp rank 0 only, the last stage's copy
  // of the tied embedding not at all.
  bool counts_in_norm(int param_id) const;

  // GPT-2 initialisation: N(0, 0.02) weights, residual projections scaled by
  // 1/sqrt(2L), zero biases, unit layernorm weights. Deterministic for a seed
  // and the same for every shard layout (each rank draws the whole model's
  // sequence and keeps its blocks). Off the CPU the draws go through a host
  // copy: memory the host cannot give or a failed upload is the error.
  Status init_weights(uint64_t seed);

  // Token ids in [0, V) and T <= maxT, or an error naming the first bad one.
  Status check_batch(const int* inputs, const int* targets, int B, int T) const;

  // Whole-model forms (shard().tp == 1, one stage; CHECKed), slot 0.
  // Forward pass over inputs (B,T). With targets, returns the mean
  // cross-entropy and keeps what try_backward() needs; without, returns 0 and only
  // try_logits() are meaningful. The caller checks the batch (check_batch).
  // Out of memory for the activations or a device failure is returned.
  Result<float> try_forward(const int* inputs, const int* targets, int B, int T);
  // Logits (B,T,Vp) of slot 0's last forward; columns >= V are padding. On a
  // tensor-parallel last stage, this rank's (B,T,Vp/tp) columns. Host
  // memory: on the CPU the activation itself, on CUDA a copy made by this
  // call (valid until the next call or forward). On CUDA only when that
  // forward's B*T rows fit in one head chunk (B*T <= head_chunk_rows()) and
  // no other forward or backward ran since; CHECKed. A failed device copy
  // is returned.
  Result<const float*> try_logits() const;
  // Per-position losses (B,T) of slot 0's last forward with targets; host
  // memory as try_logits().
  Result<const float*> try_losses() const;

  // CUDA: rows of logits (each Vp/tp wide) the output layer materialises at
  // once; forward computes the loss chunk by chunk, backward recomputes each
  // chunk's logits and turns them into dlogits in place. Changing it drops
  // the activation arenas (reserve again). The CPU backends ignore it and
  // keep the full (B,T,Vp) logits and probabilities.
  static constexpr int kDefaultHeadChunkRows = 2048;
  void set_head_chunk_rows(int rows);
  int head_chunk_rows() const { return head_chunk_rows_; }

  // ---- Pipeline-stage interface. Activations of up to `slots` micro-batches
  // in flight are kept at once (1F1B keeps pp - stage, GPipe all of them).
  // Call try_reserve_activations() before using slots; try_forward() does it
  // itself. Grows the arenas to at least (B, T, slots) (B, T, slots >= 1,
  // CHECKed); out of host or device memory is the arena's error, and the
  // activations held before stay as they were.
  Status try_reserve_activations(int B, int T, int slots);
  int activation_slots() const { return static_cast<int>(slot_acts_.size()); }
  int64_t activation_bytes() const;
  // (B,T,C) buffers for the pipeline's messages: the input a non-first stage
  // receives into, the output a non-last stage sends, the gradient of that
  // output a non-last stage receives into before backward, and the gradient
  // of the input a non-first stage sends after backward (valid until the
  // slot's next backward). Arena memory: device pointers on CUDA.
  float* stage_input(int slot);
  const float* stage_output(int slot) const;
  float* stage_output_grad();
  const float* stage_input_grad(int slot) const;
  // Forward of this stage's part on micro-batch slot: the first stage reads
  // inputs (B,T) token ids, others stage_input(slot). targets are needed on
  // the last stage (for backward too), which sets *loss to the mean
  // cross-entropy; elsewhere they may be null. Errors come from tp
  // communication and from copies between the host and the device.
  Status forward_stage(int slot, const int* inputs, const int* targets, int B, int T, float* loss);
  // Backward of slot's forward; a non-last stage first receives
  // d(stage output) into stage_output_grad().
  Status backward_stage(int slot, float loss_scale);
  // Seconds spent in tensor-parallel all-reduces since the last call.
  double take_tp_comm_seconds();

  // ---- Inference: one forward over a ragged batch (TokenBatch) that reads
  // and writes keys and values through a paged KV cache (nn/kv_cache.h),
  // so one call can prefill some sequences and decode others. The layers are
  // the ones training runs (layer_forward); only attention differs (paged
  // instead of the (B,T) causal block) and the head, which runs only for the
  // rows asked for. Whole model, tp == 1, any backend.
  // Each row's key and value are written into the cache before attention,
  // so a row sees the rows of its sequence at lower positions in the same
  // batch; positions fed by earlier calls must not be fed again.
  // logits (R, Vp) host memory gets the logits of batch rows logit_rows (R
  // indices in [0, N), in that order; columns >= V are padding). Errors
  // (nothing is written to the cache): mismatched sizes, a token outside the
  // vocabulary, a dead sequence, a position not reserved with extend(), a
  // cache made for another model; out of memory for a batch larger than any
  // before, or a failed device copy. Allocates only when a batch is larger
  // than any before.
  Status forward_tokens(const TokenBatch& batch, PagedKVCache& cache, std::span<const int> logit_rows,
                        float* logits);
  // Bytes of the inference scratch (forward_tokens' activations).
  int64_t inference_scratch_bytes() const { return static_cast<int64_t>(infer_.bytes() + infer_ints_.bytes()); }

  // A device failure is the error (one branch a step on the CPU).
  Status zero_grad() { return grads_.try_zero(); }
  // Not owned; nullptr for none.
  void set_grad_listener(GradListener* l) { listener_ = l; }
  // Accumulates d(loss_scale * mean loss)/d(params) into grads() for the last
  // try_forward(); loss_scale is 1/grad_accum when accumulating micro-steps.
  // Whole model (CHECKed): backward_stage() of slot 0, whose device or tp
  // communication failure is returned.
  Status try_backward(float loss_scale = 1.0f);

 private:
  // create()'s one code path: the constructor stores the arguments, init()
  // checks them and allocates.
  struct Uninitialised {};
  GPT(Uninitialised, const GPTConfig& config, Backend backend, const ModelShard& shard, comm::Communicator* tp_comm,
      ModelUse use);
  Status init();
  static ParamPtrs ptrs(const Arena& a);
  // One transformer block, forward, on N rows: the same code for training
  // (dense causal attention over (B,T), activations kept per layer) and
  // inference (paged attention, activations in one reused scratch).
  struct LayerActs;
  struct AttentionArgs;
  Status layer_forward(int l, const LayerActs& a, const float* residual, int N, const AttentionArgs& at);
  // LayerNorm or RMSNorm over C channels (mean unused by RMSNorm).
  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                    int N) const;
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                     const float* mean, const float* rstd, int N) const;
  // Floats per (b, h, t) row of the attention buffers: the backend's, or T
  // for grouped-query attention, whose kernels keep the (T,T) matrices on
  // every backend.
  int64_t att_saved_floats(int T, int hs) const {
    return config_.kv() != config_.heads ? T : ops_.attention_saved_floats(T, hs);
  }
  int64_t att_scratch_floats(int T, int hs) const {
    return config_.kv() != config_.heads ? T : ops_.attention_scratch_floats(T, hs);
  }
  // The rotary frequencies (hs/2) on the model's device; null without rope.
  const float* rope_freq() const { return rope_.count() > 0 ? rope_.tensor(0).f32() : nullptr; }
  Status reserve_inference(int N, int R, int64_t ints);
  Status tp_all_reduce(float* x, int64_t n);
  Status tp_all_reduce_max(float* x, int64_t n);

  GPTConfig config_;
  ModelShard shard_;
  comm::Communicator* tp_comm_ = nullptr;
  int local_layers_ = 0;
  int Vl_ = 0, v0_ = 0;  // vocabulary rows this rank holds: [v0_, v0_ + Vl_)
  double tp_seconds_ = 0.0;
  Backend backend_;
  Device device_;
  ModelUse use_ = ModelUse::kTraining;
  const OpsTable& ops_;
  MatmulPrecision prec_ = MatmulPrecision::kF32;
  // quantize_int8()'s weights: per layer qkv, attproj, fc, fcproj, then the
  // output layer; null until quantized.
  struct Int8Weights;
  std::shared_ptr<const Int8Weights> int8_;
  std::shared_ptr<const std::vector<Q4Matrix>> q4_;  // quantize_q4()'s or load_q4()'s, in the same order
  bool fp32_released_ = false;
  int64_t released_bytes_ = 0;
  // set_quantized_embeddings(): the rows, their format and size, and the
  // dequantized rows of the batch being looked up (with ids 0..N-1 for the
  // embedding op).
  RowFormat embed_format_ = RowFormat::kQ8_0;
  int64_t embed_row_bytes_ = 0;
  std::vector<uint8_t> embed_rows_;
  std::vector<float> embed_batch_;
  std::vector<int> embed_ids_;
  // The rows of ids[0..N) into embed_batch_ (N x C) and embed_ids_ =
  // 0..N-1; an id outside the vocabulary is an error.
  Status dequantize_embeddings(const int* ids, int N);
  // out (N,OC) = inp @ W^T + bias, in int8 or int4 when quantized (index:
  // 4*l + k for layer l's k-th matmul, 4*L for the head), in fp32 of few
  // rows on the CPU by cpu::matmul_f32_rows, else ops_.matmul_forward.
  void linear(float* out, const float* inp, const float* w, int q, const float* bias, int N, int C, int OC) const;
  bool few_rows_f32(int N) const;  // linear() takes cpu::matmul_f32_rows
  // (OC, C) of matmul k in load_int8's order (4 per layer, then the head).
  std::pair<int, int> matmul_shape(int k) const;
  // Why this model cannot take int4 weights now (load_q4, quantize_q4).
  Status check_q4_use() const;
  GradListener* listener_ = nullptr;
  Arena params_, grads_;
  Arena rope_;                        // rope_inv_freq() on the device
  std::vector<int> host_positions_;   // forward_stage's staging of the positions
  // Activations kept for backward, one arena per slot, and scratch shared by
  // all slots (forward scratch and gradient buffers; gpt.cc's ActId).
  std::vector<Arena> slot_acts_;
  Arena scratch_;
  int act_B_ = 0, act_T_ = 0;  // activation capacity
  struct SlotState {
    int B = 0, T = 0;
    bool has_targets = false;
  };
  std::vector<SlotState> slot_state_;
  std::vector<int> acts_idx_;  // ActId -> index in its arena, see gpt.cc
  // The chunked output layer (CUDA): chunk size, and which logits the chunk
  // buffer holds now: rows [row0, row0 + rows) of slot's forward (slot -1:
  // none, e.g. after backward turned them into dlogits).
  bool chunked_head() const { return ops_.crossentropy_lse_forward != nullptr; }
  int head_chunk_rows_ = kDefaultHeadChunkRows;
  struct HeldLogits {
    int slot = -1, row0 = 0, rows = 0;
  };
  HeldLogits held_logits_;
  // Off the CPU: host copies of the losses (summed into the loss) and of
  // what try_logits()/try_losses() return.
  std::vector<float> host_losses_;
  mutable std::vector<float> host_logits_, host_losses_out_;
  // forward_tokens' scratch: activations for infer_rows_ rows and logits for
  // infer_out_ rows (device), the batch's index arrays (device), and their
  // host staging.
  Arena infer_, infer_ints_;
  int infer_rows_ = 0, infer_out_ = 0;
  int64_t infer_int_count_ = 0;
  std::vector<int> host_ints_;
  std::vector<int> batch_seqs_, batch_row_seq_;  // forward_tokens' per-call bookkeeping
};

}  // namespace tessera

// What a training rank puts in a checkpoint and how it takes it back
// (docs/formats/checkpoint.md has the file format, src/ckpt the machinery).
//
// Each rank saves the pieces it owns, so the checkpoint holds every element
// once: parameter blocks ("param/NAME") on dp rank 0, AdamW moments
// ("adam_m/NAME", "adam_v/NAME") on dp rank 0 or, with ZeRO-1, each dp rank's
// flat range; tensors replicated across tp ranks on tp rank 0 only, the tied
// embedding on the first stage only. Blocks are TensorSlices of the whole
// model (param_slice()), so a checkpoint saved by one dp x tp x pp layout
// (ZeRO on or off) loads into any other of the same model: each rank reads
// just the blocks and flat ranges it holds.
//
// The per-rank state is JSON: {"step": completed steps, "adam_t": AdamW's
// step count}. The data loader is stateless (a step's batch is a function of
// the seed and the step), and training draws no other random numbers, so
// that is all a bitwise resume needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpointer.h"
#include "nn/gpt.h"
#include "optim/zero.h"

namespace tessera {

// {"layers", "heads", "dim", "vocab", "context"}, and back.
nlohmann::json model_config_json(const GPTConfig& c);
Result<GPTConfig> model_config_from_json(const nlohmann::json& j);

// Host copies of a CUDA model's checkpointed tensors: the pieces of a save
// must be host memory (ckpt::SavePiece). Kept between saves so its memory is
// allocated once.
struct CheckpointMirror {
  Arena params;             // the parameter arena's layout, on the host
  std::vector<float> m, v;  // ShardedAdamW::state()'s [lo, hi)
};

// This rank's pieces; dp_rank is the rank's coordinate on the dp axis. For a
// model on a CUDA device, the parameters and AdamW moments are first copied
// into *mirror (blocking device-to-host copies after the queued kernels:
// the part of a save that stalls training longest) and the pieces point
// there; mirror must then be non-null and outlive the pieces' use. Memory
// the host cannot give for the mirror or a failed device copy is the error
// (a host model's pieces need neither).
Result<std::vector<ckpt::SavePiece>> checkpoint_pieces(GPT& model, const ShardedAdamW& opt, int dp_rank, int zero,
                                                       CheckpointMirror* mirror = nullptr);

struct ResumeState {
  int64_t step = 0;  // optimizer steps completed
  int adam_t = 0;
};

// Reads this rank's parameters and AdamW moments out of ck (any layout of
// the same model; error naming the difference otherwise) and returns the
// step to continue from. A CUDA model's tensors are read into host memory,
// then copied to the device.
Result<ResumeState> load_checkpoint(const ckpt::Checkpoint& ck, GPT& model, ShardedAdamW& opt);

// The whole model's parameters from a checkpoint, loaded for inference (no
// gradients): export and tessera serve.
Result<std::unique_ptr<GPT>> load_whole_model(const ckpt::Checkpoint& ck);

}  // namespace tessera

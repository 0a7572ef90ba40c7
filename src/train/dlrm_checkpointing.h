// What a DLRM training rank puts in a checkpoint and how it takes it back
// (docs/formats/dlrm-checkpoint.md; the files and their publishing are
// src/ckpt's, as for GPT).
//
// Tensors are logical, independent of how many ranks saved them:
//   "dense" (P)            the MLPs' flat parameters (Dlrm's layout), rank 0
//   "adam_m", "adam_v" (P) AdamW's moments, rank 0
//   "table/T" (E_T, D)     table T; each rank saves the row ranges it owns
//   "adagrad/T" (E_T)      table T's row-wise Adagrad state, the same rows
// so a checkpoint written by N ranks loads at M: each rank reads the row
// ranges it owns (ckpt::Checkpoint::read intersects the stored pieces).
// Rank 0's state (JSON): {"step", "adam_t", "data_row", "epoch"}; the batch
// of a step is a function of the step (rows in file order), so these are all
// a bitwise resume needs.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpointer.h"
#include "parallel/dlrm_parallel.h"

namespace tessera {

// {"num_dense", "dim", "bottom", "top", "table_rows", "pooling"}, and the check
// that a checkpoint's model is the config's (InvalidArgument naming the first
// difference).
nlohmann::json dlrm_config_json(const DlrmConfig& c);
Status check_dlrm_config(const nlohmann::json& saved, const DlrmConfig& want, const std::string& where);

// This rank's pieces (pointing into the engine's buffers: valid until the
// next train_step). rank: the world rank (0 saves the replicated tensors).
std::vector<ckpt::SavePiece> dlrm_checkpoint_pieces(DlrmParallel& engine, int rank);

struct DlrmResumeState {
  int64_t step = 0;      // steps completed
  int64_t adam_t = 0;    // AdamW steps
  int64_t data_row = 0;  // the next training row
  int64_t epoch = 0;     // passes over data.train completed
};

// Reads the engine's dense parameters, moments and owned table rows (with
// their Adagrad state) out of ck and sets its AdamW step; returns rank 0's
// state. Errors: another model (InvalidArgument), a table optimizer that
// the checkpoint has no state for, unreadable or corrupt pieces.
Result<DlrmResumeState> load_dlrm_checkpoint(const ckpt::Checkpoint& ck, DlrmParallel& engine);

}  // namespace tessera

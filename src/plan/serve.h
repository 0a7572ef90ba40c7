// What serving a decoder takes on one device of a node (docs/planner.md,
// "Serving"): one replica a device (a GPU, or a whole CPU node), its
// weights and the batch's keys and values in the device's memory, a decode
// step priced at the roof of its reads (every matmul weight once, the
// batch's cache) or at its arithmetic at the peak, whichever is longer, and
// a prompt's prefill at the GEMM efficiency of its shape. The decode figure
// is a ceiling: Tessera's one-sequence CPU decode measured 0.58-0.95 of its
// read roof (docs/performance.md, "Where issue #31 stands"); the GPU's
// kernel launches and the CPU's threads' joins are not in it.
#pragma once

#include <string>

#include "core/status.h"
#include "plan/hardware.h"
#include "plan/model.h"

namespace tessera::plan {

struct ServeJob {
  std::string dtype = "int8";  // the weights: fp32, bf16, int8 or int4 (the last two: Tessera's CPU tiers)
  int batch = 1;               // sequences decoded together
  int prompt = 128;            // each sequence's prompt tokens
  int tokens = 128;            // tokens each sequence generates
};

struct ServeEstimate {
  double weight_bytes = 0;        // resident: every parameter in the dtype
  double stream_bytes = 0;        // what a decode step reads of them: every matmul weight, the head's included
  double kv_bytes_per_token = 0;  // one position's keys and values, all layers (16-bit)
  double cache_bytes = 0;         // the batch's cache at prompt + tokens
  double cache_read_bytes = 0;    // what a decode step reads of it, at the mean context
  double memory = 0;              // weights + cache_bytes
  double capacity = 0;            // the device's memory
  bool fits = false;
  double roof = 0;                // bytes/s the decode step's reads are priced at
  std::string roof_source;        // which figure that is
  double decode_step = 0;         // seconds: the batch's step at the mean context, prompt + tokens / 2
  bool compute_bound = false;     // the step's arithmetic at the peak outlasts its reads
  double decode_tokens_per_s = 0; // the batch's, all sequences together (a ceiling)
  double prefill_tokens_per_s = 0;  // one prompt
  double usd_per_million = 0;     // generated tokens, from the device's share of the node's price (0: no price)
  std::string refusal;            // why it does not fit
};

// Errors: a dtype other than fp32, bf16, int8, int4; int8 or int4 on a GPU
// (Tessera's GPU path serves fp32 and bf16); a batch, prompt or token count
// under 1.
Result<ServeEstimate> estimate_serving(const ModelSpec& model, const NodeType& node, const ServeJob& job,
                                       double price_per_device_hour);

}  // namespace tessera::plan

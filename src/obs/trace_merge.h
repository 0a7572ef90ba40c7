// `tessera trace merge`: the per-rank trace files of a `--trace DIR` run
// (trace-rank-N.json, written by obs/trace.h) merged into one trace-event
// file on rank 0's clock, for Perfetto or chrome://tracing.
//
// Each rank's file carries otherData.tessera.clock_offset_us, the offset of
// its steady clock to rank 0's measured at start-up (train/tracing.h); every
// timestamp of rank r becomes ts + offset_r, and then the earliest event of
// all ranks is moved to 0. Events are written in time order (metadata
// events first). The method and its error bound: docs/monitoring.md.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::obs::trace {

struct MergeSummary {
  std::vector<int> ranks;     // the ranks found, ascending
  size_t events = 0;          // events written, metadata included
  double max_clock_error_us = 0;  // the largest of the ranks' offset error bounds
};

// NotFound when `dir` is missing or holds no trace-rank-*.json; Corruption
// naming the file when one is not JSON or not a tessera trace (no
// traceEvents, no clock offset, a rank that does not match its name); IOError
// naming out_path when it cannot be written.
Result<MergeSummary> merge_trace_dir(const std::string& dir, const std::string& out_path);

}  // namespace tessera::obs::trace

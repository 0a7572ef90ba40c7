// The process_* figures every Prometheus client library exports, read from
// Linux's /proc/self: CPU time, resident and virtual memory, start time and
// open file descriptors. An exporter refreshes them at each scrape, so they
// cost nothing between scrapes.
//
// Thread safety: both functions may be called from any thread, concurrently.
#pragma once

#include <string>

#include "core/status.h"
#include "obs/metrics.h"

namespace tessera::obs {

struct ProcessStats {
  double cpu_seconds = 0;         // user + system CPU time of all threads
  double resident_bytes = 0;      // resident set size
  double peak_resident_bytes = 0; // its high-water mark (VmHWM; 0 where unknown)
  double virtual_bytes = 0;       // virtual memory size
  double start_time_seconds = 0;  // since the Unix epoch
  double open_fds = 0;
};

// IOError naming the file when /proc/self/stat or /proc/self/statm cannot
// be read or parsed (not Linux, /proc not mounted). start_time_seconds and
// open_fds stay 0 when /proc/stat or /proc/self/fd cannot be read.
Result<ProcessStats> read_process_stats();

// The memory this host gives a process, in bytes, and where the figure
// comes from: the smaller of physical memory (MemTotal) and the cgroup's
// limit (cgroup v2 memory.max, v1 memory.limit_in_bytes). Unknown: 0 bytes.
// Compared, before allocating, with what a training rank (train/memory_plan.h)
// or a server (weights and KV cache) needs (issue #18 item 1).
struct MemoryLimit {
  double bytes = 0;
  std::string source;  // "physical memory", "the cgroup's memory limit"
};
MemoryLimit host_memory_limit();

// Reads them and records them under Prometheus' standard names:
//   process_cpu_seconds_total      counter
//   process_resident_memory_bytes  gauge
//   process_virtual_memory_bytes   gauge
//   process_start_time_seconds     gauge
//   process_open_fds               gauge
// Records nothing when they cannot be read.
void update_process_metrics(Registry& registry);

}  // namespace tessera::obs

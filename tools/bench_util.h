// Helpers shared by the communication benchmarks (cmd_bench_comm.cc,
// cmd_bench_p2p.cc): flag conventions that hold before MPI is up.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace tessera::tools {

// This process's rank as the launcher tells it, before MPI is up: only rank 0
// reports bad flags, not every rank.
int launcher_rank();
// Rank 0 prints "tessera: error: <msg>"; every rank returns kExitUsage.
int usage_error(const std::string& msg);
// "1024", "1K", "8M", "2G" (powers of 1024), as nccl-tests reads -b/-e.
Result<int64_t> parse_size(const std::string& flag, const std::string& text);

}  // namespace tessera::tools

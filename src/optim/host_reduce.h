// All-reduce of a few host values (a norm's squares, a hash) over any
// communicator, also one that takes device buffers (NCCL): the values then
// travel through a small device scratch buffer, with blocking copies on the
// compute stream (the communicator is expected to be ordered after it,
// Communicator::order_after_compute). Owns the scratch; the communicator
// must outlive it. Not thread-safe.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "core/status.h"
#include "tensor/arena.h"

namespace tessera {

class HostReduce {
 public:
  static constexpr int64_t kMaxBytes = 16;

  // Out of device memory for the scratch is the arena's error.
  static Result<HostReduce> create(comm::Communicator& comm);
  // In place over count values at host pointer data (count * elem_size <= kMaxBytes).
  Status all_reduce(void* data, int64_t count, comm::ElemType type, comm::ReduceOp op);

 private:
  struct Uninitialised {};
  HostReduce(Uninitialised, comm::Communicator& comm) : comm_(comm) {}
  Status init();

  comm::Communicator& comm_;
  Arena scratch_;  // kMaxBytes on the device, when comm_ takes device memory
};

}  // namespace tessera

#include "optim/host_reduce.h"

#include "core/check.h"
#include "tensor/device_memory.h"

namespace tessera {

Status HostReduce::init() {
  if (!comm_.takes_device_memory()) return Status::OK();
  scratch_.reserve("scratch", DType::kF32, Shape{kMaxBytes / 4});
  scratch_.set_device(Device::kCUDA);
  return scratch_.try_allocate().With("the scratch of a host all-reduce");
}

Result<HostReduce> HostReduce::create(comm::Communicator& comm) {
  HostReduce h(Uninitialised{}, comm);
  RETURN_IF_ERROR(h.init());
  return h;
}

Status HostReduce::all_reduce(void* data, int64_t count, comm::ElemType type, comm::ReduceOp op) {
  if (!scratch_.allocated()) return comm_.all_reduce(data, data, count, type, op);
  const size_t bytes = static_cast<size_t>(count) * comm::elem_size(type);
  CHECK(bytes <= static_cast<size_t>(kMaxBytes));
  // Blocking copies on the compute stream; the all-reduce is ordered after
  // the first by the producer stream, and wait() returning OK means the
  // result is in place for the second.
  void* dev = scratch_.base();
  RETURN_IF_ERROR(try_copy_to_device(Device::kCUDA, dev, data, bytes));
  RETURN_IF_ERROR(comm_.all_reduce(dev, dev, count, type, op));
  RETURN_IF_ERROR(try_copy_to_host(Device::kCUDA, data, dev, bytes));
  return Status::OK();
}

}  // namespace tessera

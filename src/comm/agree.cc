#include "comm/agree.h"

#include <string>
#include <vector>

#include "core/host.h"

namespace tessera::comm {

constexpr size_t kMaxText = 64 << 10;

Status agree(Communicator& c, const Status& mine) {
  if (c.takes_device_memory())
    return Status::InvalidArgument(
        fmt::format("comm::agree needs a host-memory communicator; '{}' takes device memory", c.name()));
  if (c.size() == 1) return mine;
  // The lowest failing rank, or size() when none failed.
  int32_t failed = mine.ok() ? c.size() : c.rank();
  RETURN_IF_ERROR(c.all_reduce(&failed, &failed, 1, ElemType::kI32, ReduceOp::kMin));
  if (failed == c.size()) return Status::OK();
  // That rank tells the others its code and "rank R on host H: message".
  std::string text;
  int64_t head[2] = {0, 0};  // {code, bytes of text}
  if (c.rank() == failed) {
    text = fmt::format("rank {} on host {}: {}", failed, host_name(), mine.message());
    if (text.size() > kMaxText) text.resize(kMaxText);
    head[0] = static_cast<int64_t>(mine.code());
    head[1] = static_cast<int64_t>(text.size());
  }
  RETURN_IF_ERROR(c.broadcast(head, 2, ElemType::kI64, failed));
  if (head[1] < 0 || head[1] > static_cast<int64_t>(kMaxText))
    return Status::Internal(fmt::format("comm::agree: rank {} sent a message of {} bytes", failed, head[1]));
  text.resize(static_cast<size_t>(head[1]));
  if (head[1] > 0) RETURN_IF_ERROR(c.broadcast(text.data(), head[1], ElemType::kU8, failed));
  if (c.rank() == failed) return mine;
  switch (static_cast<StatusCode>(head[0])) {
    case StatusCode::kInvalidArgument: return Status::InvalidArgument(text);
    case StatusCode::kNotFound: return Status::NotFound(text);
    case StatusCode::kCorruption: return Status::Corruption(text);
    case StatusCode::kIOError: return Status::IOError(text);
    case StatusCode::kUnavailable: return Status::Unavailable(text);
    case StatusCode::kResourceExhausted: return Status::ResourceExhausted(text);
    case StatusCode::kOk:  // a failing rank's status is never OK
    case StatusCode::kInternal: break;
  }
  return Status::Internal(text);
}

}  // namespace tessera::comm

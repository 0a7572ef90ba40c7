#include "comm/communicator.h"
#include "comm/done_work.h"

#include <cstring>

#include <fmt/format.h>

#include "core/check.h"

namespace tessera::comm {

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::kF32: return 4;
    case ElemType::kF64: return 8;
    case ElemType::kI32: return 4;
    case ElemType::kI64: return 8;
    case ElemType::kU64: return 8;
    case ElemType::kU8: return 1;
  }
  CHECK(false && "unknown ElemType");
  return 0;
}

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::kF32: return "float";
    case ElemType::kF64: return "double";
    case ElemType::kI32: return "int32";
    case ElemType::kI64: return "int64";
    case ElemType::kU64: return "uint64";
    case ElemType::kU8: return "uint8";
  }
  CHECK(false && "unknown ElemType");
  return "";
}

std::string format_rank_runs(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) j++;
    if (!out.empty()) out += ",";
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return out;
}

std::string format_peer_list(const std::vector<int>& peers) {
  constexpr size_t kMaxNamed = 16;
  std::string out = "[";
  for (size_t i = 0; i < peers.size() && i < kMaxNamed; i++) out += fmt::format("{}{}", i ? ", " : "", peers[i]);
  if (peers.size() > kMaxNamed) out += fmt::format(", ... and {} more", peers.size() - kMaxNamed);
  return out + "]";
}

Status check_all_to_all_v_args(int size, int rank, const void* send, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& send_displs, const void* recv,
                               const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs) {
  const std::pair<const char*, const std::vector<int64_t>*> args[] = {{"send_counts", &send_counts},
                                                                      {"send_displs", &send_displs},
                                                                      {"recv_counts", &recv_counts},
                                                                      {"recv_displs", &recv_displs}};
  for (const auto& [what, v] : args) {
    if (static_cast<int64_t>(v->size()) != size)
      return Status::InvalidArgument(
          fmt::format("{} has {} entries, expected {} (one per rank of the communicator)", what, v->size(), size));
    for (int p = 0; p < size; p++)
      if ((*v)[static_cast<size_t>(p)] < 0)
        return Status::InvalidArgument(fmt::format("{}[{}] = {} is negative", what, p, (*v)[static_cast<size_t>(p)]));
  }
  for (int p = 0; p < size; p++) {
    if (send == nullptr && send_counts[static_cast<size_t>(p)] > 0)
      return Status::InvalidArgument(fmt::format("send is null but send_counts[{}] = {}", p, send_counts[p]));
    if (recv == nullptr && recv_counts[static_cast<size_t>(p)] > 0)
      return Status::InvalidArgument(fmt::format("recv is null but recv_counts[{}] = {}", p, recv_counts[p]));
  }
  if (send_counts[rank] != recv_counts[rank])
    return Status::InvalidArgument(fmt::format("send_counts[{0}] = {1} but recv_counts[{0}] = {2} (this rank's own block)",
                                               rank, send_counts[rank], recv_counts[rank]));
  return Status::OK();
}

namespace {

// The default all-to-all: one receive from and one send to every other
// rank, all posted at once; complete when every part is. wait() waits on the
// parts in posting order, each under the backend's deadline, and returns the
// first error, naming the operation.
class AllToAllVWork final : public Work {
 public:
  AllToAllVWork(std::string what, std::vector<std::unique_ptr<Work>> parts)
      : what_(std::move(what)), parts_(std::move(parts)) {}
  bool test() override {
    while (next_ < parts_.size() && parts_[next_]->test()) next_++;
    return next_ == parts_.size();
  }
  Status wait() override {
    Status first;
    for (std::unique_ptr<Work>& w : parts_) {
      Status st = w->wait();
      if (!st.ok() && first.ok()) first = st;
    }
    next_ = parts_.size();
    return first.ok() ? first : first.With(what_);
  }

 private:
  std::string what_;
  std::vector<std::unique_ptr<Work>> parts_;
  size_t next_ = 0;  // parts before it are complete
};

}  // namespace

std::unique_ptr<Work> Communicator::all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                                       const std::vector<int64_t>& send_displs, void* recv,
                                                       const std::vector<int64_t>& recv_counts,
                                                       const std::vector<int64_t>& recv_displs, ElemType type) {
  const int n = size(), me = rank();
  const std::string what = fmt::format("all_to_all_v on communicator '{}' (rank {} of {})", name(), me, n);
  if (Status st = check_all_to_all_v_args(n, me, send, send_counts, send_displs, recv, recv_counts, recv_displs);
      !st.ok())
    return std::make_unique<DoneWork>(st.With(what));
  const int64_t esz = static_cast<int64_t>(elem_size(type));
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  std::vector<std::unique_ptr<Work>> parts;
  // Receives first, then sends, both in shifted order (peer me+s, me-s) so
  // that every pair meets early whatever the backend's matching.
  for (int s = 1; s < n; s++) {
    const int from = (me - s + n) % n;
    parts.push_back(recv_async(dst + recv_displs[from] * esz, recv_counts[from] * esz, from, kAllToAllTag));
  }
  for (int s = 1; s < n; s++) {
    const int to = (me + s) % n;
    parts.push_back(send_async(src + send_displs[to] * esz, send_counts[to] * esz, to, kAllToAllTag));
  }
  if (send_counts[me] > 0)
    std::memmove(dst + recv_displs[me] * esz, src + send_displs[me] * esz, static_cast<size_t>(send_counts[me] * esz));
  return std::make_unique<AllToAllVWork>(what, std::move(parts));
}

}  // namespace tessera::comm

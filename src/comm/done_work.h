// A Work that is complete when made, holding its outcome: what a backend
// returns for an operation that finished inside the call (the one-rank and
// thread communicators, Gloo's blocking algorithms) or failed before it was
// posted (bad arguments).
#pragma once

#include <utility>

#include "comm/communicator.h"

namespace tessera::comm {

class DoneWork final : public Work {
 public:
  explicit DoneWork(Status st = Status::OK()) : status_(std::move(st)) {}
  bool test() override { return true; }
  Status wait() override { return status_; }

 private:
  Status status_;
};

}  // namespace tessera::comm

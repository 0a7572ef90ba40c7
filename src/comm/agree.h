// agree(): one status for every rank of a communicator. Each rank passes its
// own (OK, or why it cannot go on); each gets back the job's outcome, so one
// rank's failure is every rank's error at once rather than a peer waiting at
// the next collective until its deadline.
//
// The outcome is the lowest failing rank's error, with its code, on every
// rank (an InvalidArgument stays a user error everywhere, an Unavailable
// stays retryable, and every rank takes the same way out). On that rank it is
// its own status unchanged; on the others, the failing ones included, the
// message is "rank R on host H: <that rank's message>". When every rank is OK it costs one all-reduce of an
// int32; a failure adds two broadcasts (its code and length, its text).
//
// Collective over `c`: every rank must call it, with host memory
// (not a communicator that takes device memory, such as NCCL's).
#pragma once

#include "comm/communicator.h"
#include "core/status.h"

namespace tessera::comm {

Status agree(Communicator& c, const Status& mine);

}  // namespace tessera::comm

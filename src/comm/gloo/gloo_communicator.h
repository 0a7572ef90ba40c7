// The Gloo backend of Communicator (TCP transport): the communicator of
// elastic training, built at run time from a rendezvous store and torn down
// and rebuilt when the membership changes (src/elastic, docs/elastic.md).
//
// Rendezvous: every member calls make_gloo_communicator() with the same
// store prefix (one per round), its rank and the size; each publishes its
// listening address under the prefix and connects to every other member
// (Gloo's full mesh). Operations are Gloo's synchronous collectives
// (all_to_all_v: gloo::alltoallv, through packed copies when the blocks
// are not back to back): the
// async forms run the operation when posted and return a completed Work
// holding its status, so buckets posted during backward are exchanged then.
//
// Deadlines and failures: every operation carries CommOptions::timeout
// (Gloo's per-operation timeout); the connect has its own deadline
// (GlooConnect::timeout: a rendezvous bound, apart from the collectives').
// A failure (a peer's connection closed or reset, a deadline) comes back as
// Status::Unavailable naming the operation, its sequence number, this rank,
// the peers (with their names when given) and Gloo's message (which names
// the peer's address for a closed connection, no one for a deadline: for a
// deadline of a ring operation, all_reduce and all_gather, or of a recv,
// the error adds the rank this one was waiting on). The first failure breaks the communicator: its Gloo context is
// destroyed at once, closing every connection, so the peers blocked on this
// rank fail within milliseconds instead of waiting for their deadline; later
// operations fail at once with the first error.
//
// Thread safety: as Communicator. Only host memory.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous/store.h"

namespace tessera::comm {

struct GlooConnect {
  // The deadline of the connect (every peer's address in the store, every
  // connection up); 0: options.timeout.
  std::chrono::milliseconds timeout{0};
  // Each rank's name for errors (e.g. "host:pid"), by rank; empty: ranks only.
  std::vector<std::string> names;
};

// rank in [0, size); keys are written under `prefix` in the store; host: the
// address this rank listens on for its peers (an interface address, e.g.
// the local address of the store connection). options.timeout: every
// operation's deadline. Errors: the peers did not all publish their address
// or connect within connect.timeout (Unavailable).
Result<std::unique_ptr<Communicator>> make_gloo_communicator(Store& store, const std::string& prefix,
                                                             int rank, int size, const std::string& host,
                                                             const CommOptions& options,
                                                             const std::string& name = "world",
                                                             const GlooConnect& connect = {});

}  // namespace tessera::comm

// Elastic rendezvous rounds over the rendezvous store (comm/rendezvous/store.h:
// embedded or Redis; docs/elastic.md has the protocol and its keys). Every
// round has an epoch number; a worker joins a round by adding itself to the
// round's counter; the first to join leads the
// round and closes it when `max` have joined, or when at least `min` have
// joined and the last-call wait has passed. Below `min` for the whole
// rendezvous timeout, the leader fails the round, and every member gets the
// same error. A closed round's members connect a Gloo communicator under the
// round's own key prefix. The leader beats (a counter) while the round is
// open; members that see the beat stop abandon the round (a dead leader).
//
// Not thread-safe; one training loop drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous/store.h"
#include "core/fault_plan.h"

namespace tessera::elastic {

struct RendezvousOptions {
  std::string job;
  int min = 1, max = 1;
  double last_call_s = 1.0;  // after min have joined, how long to wait for more
  double timeout_s = 60.0;   // below min this long: the job fails
  std::string host;          // this worker's address for its peers
  const FaultPlan* faults = nullptr;  // a test's deaths in the rounds (fault_point); not owned
};

struct Member {
  std::string id;  // "host:pid"
  int prev_rank = -1;  // its rank in the round before; -1: new
};

struct Round {
  int64_t epoch = 0;
  int rank = 0, size = 0;
  std::vector<Member> members;  // by rank
  std::unique_ptr<comm::Communicator> comm;
};

class Rendezvous {
 public:
  Rendezvous(comm::Store& store, RendezvousOptions o, std::string id);

  // The round a new worker should join: one past the last closed one.
  Result<int64_t> first_epoch();
  // Joins round `epoch` or, when it has closed without this worker, the next
  // one that takes it. Errors: kResourceExhausted when fewer than min joined
  // within the timeout (the job cannot go on; the message is the line to
  // print); kUnavailable for a round that could not be formed (a member gone
  // during it: the leader's beat stopped, a member's record is missing 5 s
  // after the close, the connect failed): join the next epoch.
  // comm_options.timeout: the communicator's collectives' deadline;
  // connect_timeout: its connect's (0: the same).
  Result<Round> join(int64_t epoch, int prev_rank, const comm::CommOptions& comm_options,
                     std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(0));
  // Whether a worker waits in round epoch + 1 (one store request).
  Result<bool> joiner_waiting(int64_t epoch);
  // The round the last join() ended in (joined, failed or abandoned): a
  // retry joins a later one.
  int64_t last_epoch_tried() const { return tried_; }
  const RendezvousOptions& options() const { return o_; }

 private:
  std::string key(int64_t epoch, const std::string& what) const;
  Result<int> lead(int64_t epoch);
  // Sets JOB/last to epoch unless it already names a later round.
  Status raise_last(int64_t epoch);
  // A member's wait for the round to close; abandons it (kUnavailable) when
  // the leader's heartbeat stops.
  Status wait_closed(int64_t epoch);

  comm::Store& store_;
  RendezvousOptions o_;
  std::string id_;
  int64_t tried_ = -1;
};

// Test hook (tests/cli/elastic_faults.sh): a fault plan (core/fault_plan.h)
// with elastic_point POINT and elastic_epoch EPOCH (TESSERA_ELASTIC_FAULT=
// POINT@EPOCH) ends this process with the plan's kill() (SIGKILL in the CLI)
// when it reaches POINT in round EPOCH: `rdzv` (a member of the open round, after its record; a leader once
// min have joined, in the last call), `rdzv-leader` (only the round's leader,
// in the last call), `rdzv-record` (the member in slot 1, after its add and
// before its record), `transfer` (a receiver of the state broadcast, after the
// parameters and before the moments), `before-log` (EPOCH is a step here:
// rank 0 once it completed that step, before it logged it), `after-step`
// (a step too: every worker, once it completed and logged it). Only an
// agent's first worker has the fault in its plan: a restarted one rejoins.
// No plan, or no kill(): nothing happens.
void fault_point(const FaultPlan* plan, const char* point, int64_t epoch);

}  // namespace tessera::elastic

#include "elastic/rendezvous.h"


#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "comm/gloo/gloo_communicator.h"

namespace tessera::elastic {

namespace {
using Clock = std::chrono::steady_clock;
// Added to a round's counter to close it: a later joiner's add returns more
// than this and knows the round closed without it.
constexpr int64_t kClosedBias = int64_t{1} << 40;
// The leader bumps rE/beat this often while it waits to close the round; a
// member that sees no beat for kLeaderSilence abandons the round (the leader
// was killed during it). Generous: a loaded machine may not schedule the
// leader for a while, and abandoning a live round only costs a retry.
constexpr auto kBeatEvery = std::chrono::milliseconds(200);
constexpr double kLeaderSilence = 5.0;
// Every member writes its record right after its add; a record still
// missing this long after the round closed means its member died in
// between: the round is abandoned (as for a silent leader, generous for a
// loaded machine).
constexpr auto kRecordWait = std::chrono::seconds(5);
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

void fault_point(const FaultPlan* plan, const char* point, int64_t epoch) {
  if (plan == nullptr || !plan->kill || plan->elastic_point != point || plan->elastic_epoch != epoch) return;
  // Their number is a step, not a round.
  const bool step = std::strcmp(point, "before-log") == 0 || std::strcmp(point, "after-step") == 0;
  std::fprintf(stderr, "tessera: elastic: test fault: killing this worker at %s in %s %lld\n", point,
               step ? "step" : "round", static_cast<long long>(epoch));
  std::fflush(stderr);
  plan->kill();
}

Rendezvous::Rendezvous(comm::Store& store, RendezvousOptions o, std::string id)
    : store_(store), o_(std::move(o)), id_(std::move(id)) {}

std::string Rendezvous::key(int64_t epoch, const std::string& what) const {
  return fmt::format("{}/r{}/{}", o_.job, epoch, what);
}

Result<int64_t> Rendezvous::first_epoch() {
  Result<std::string> last = store_.get(o_.job + "/last");
  if (last.status().code() == StatusCode::kNotFound) return 0;
  RETURN_IF_ERROR(last.status());
  return std::strtoll(last->c_str(), nullptr, 10) + 1;
}

Result<bool> Rendezvous::joiner_waiting(int64_t epoch) {
  ASSIGN_OR_RETURN(int64_t n, store_.add(key(epoch + 1, "count"), 0));
  return n > 0;
}

// The leader's part: waits for the closing condition, closes the round and
// publishes its size (or the failure).
Result<int> Rendezvous::lead(int64_t epoch) {
  const auto t0 = Clock::now();
  std::optional<Clock::time_point> reached_min;
  Clock::time_point last_beat = t0 - kBeatEvery;
  while (true) {
    if (Clock::now() - last_beat >= kBeatEvery) {
      RETURN_IF_ERROR(store_.add(key(epoch, "beat"), 1).status());
      last_beat = Clock::now();
    }
    ASSIGN_OR_RETURN(int64_t n, store_.add(key(epoch, "count"), 0));
    if (n >= o_.min && !reached_min) {
      reached_min = Clock::now();
      fault_point(o_.faults, "rdzv", epoch);
      fault_point(o_.faults, "rdzv-leader", epoch);
    }
    if (n >= o_.max || (reached_min && since(*reached_min) >= o_.last_call_s)) break;
    if (!reached_min && since(t0) >= o_.timeout_s) {
      const std::string why = fmt::format(
          "elastic: only {} of the minimum {} workers joined round {} of job '{}' within {:.0f} s (--min, "
          "--rdzv-timeout)",
          n, o_.min, epoch, o_.job, o_.timeout_s);
      // Closed first, as any close: members that took this leader for dead
      // (it stalled past their patience) may have abandoned the round and
      // gone on in a later one meanwhile; then their "abandoned:" stands
      // and this worker joins them.
      ASSIGN_OR_RETURN(int64_t closed, store_.add(key(epoch, "count"), kClosedBias));
      if (closed >= 2 * kClosedBias)
        return Status::Unavailable(fmt::format(
            "elastic: round {} was abandoned by its members (leader silent for {:.0f} s)", epoch, kLeaderSilence));
      if (closed - kClosedBias >= o_.min) {  // min arrived just now: the round stands, with them
        const int size = static_cast<int>(std::min<int64_t>(closed - kClosedBias, o_.max));
        RETURN_IF_ERROR(store_.set(key(epoch, "closed"), std::to_string(size)));
        RETURN_IF_ERROR(raise_last(epoch));
        return size;
      }
      RETURN_IF_ERROR(store_.set(key(epoch, "closed"), "fail:" + why));
      // A failed round counts as closed: a job restarted under the same id
      // (--resume, an external store that outlives the job) starts past it.
      RETURN_IF_ERROR(raise_last(epoch));
      return Status::ResourceExhausted(why);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSIGN_OR_RETURN(int64_t closed, store_.add(key(epoch, "count"), kClosedBias));
  // A member closed it first: it took this leader for dead (wait_closed).
  if (closed >= 2 * kClosedBias)
    return Status::Unavailable(fmt::format("elastic: round {} was abandoned by its members (leader silent for {:.0f} s)",
                                           epoch, kLeaderSilence));
  const int size = static_cast<int>(std::min<int64_t>(closed - kClosedBias, o_.max));
  RETURN_IF_ERROR(store_.set(key(epoch, "closed"), std::to_string(size)));
  RETURN_IF_ERROR(raise_last(epoch));
  return size;
}

Status Rendezvous::raise_last(int64_t epoch) {
  // Never back: a round closed late (its leader stalled) must not send new
  // workers to a round the job has left. A read, then a write: two rounds
  // closing at once may still race, which costs a joiner one round.
  Result<std::string> last = store_.get(o_.job + "/last");
  if (last.ok() && std::strtoll(last->c_str(), nullptr, 10) >= epoch) return Status::OK();
  if (!last.ok() && last.status().code() != StatusCode::kNotFound) return last.status();
  return store_.set(o_.job + "/last", std::to_string(epoch));
}

Status Rendezvous::wait_closed(int64_t epoch) {
  const auto t0 = Clock::now();
  const double give_up = o_.timeout_s + o_.last_call_s + 30;
  int64_t beat = -1;
  auto beat_seen = t0;
  while (true) {
    Result<std::string> closed = store_.get(key(epoch, "closed"));
    if (closed.ok()) return Status::OK();
    if (closed.status().code() != StatusCode::kNotFound) return closed.status();
    ASSIGN_OR_RETURN(int64_t b, store_.add(key(epoch, "beat"), 0));
    if (b != beat) {
      beat = b;
      beat_seen = Clock::now();
    }
    if (since(t0) >= give_up)
      return Status::Unavailable(fmt::format("not closed within {:.0f} s", give_up));
    if (since(beat_seen) < kLeaderSilence) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    // The leader is gone: close the round so that no one else joins it, and
    // tell its members. Whoever adds the bias first decides; if the leader
    // closed it meanwhile, the round stands.
    ASSIGN_OR_RETURN(int64_t v, store_.add(key(epoch, "count"), kClosedBias));
    if (v >= 2 * kClosedBias) return store_.wait({key(epoch, "closed")}, std::chrono::seconds(30));
    const std::string why = fmt::format("abandoned: its leader was silent for {:.0f} s", since(beat_seen));
    return store_.set(key(epoch, "closed"), why);
  }
}

Result<Round> Rendezvous::join(int64_t epoch, int prev_rank, const comm::CommOptions& comm_options,
                               std::chrono::milliseconds connect_timeout) {
  while (true) {
    tried_ = epoch;
    ASSIGN_OR_RETURN(int64_t n, store_.add(key(epoch, "count"), 1));
    if (n > kClosedBias) {  // closed without this worker: the next round
      epoch++;
      continue;
    }
    const int slot = static_cast<int>(n - 1);
    if (slot >= 1 && o_.faults != nullptr && o_.faults->elastic_point == "rdzv-record" &&
        o_.faults->elastic_epoch == epoch) {
      // The first member past the leader that carries the fault: a
      // restarted worker, which does not, may have taken slot 1.
      ASSIGN_OR_RETURN(int64_t nth, store_.add(key(epoch, "record-fault"), 1));
      if (nth == 1) fault_point(o_.faults, "rdzv-record", epoch);
    }
    RETURN_IF_ERROR(store_.set(key(epoch, fmt::format("m{}", slot)), fmt::format("{} {}", prev_rank, id_)));
    int size = 0;
    if (slot == 0) {
      ASSIGN_OR_RETURN(size, lead(epoch));
    } else {
      fault_point(o_.faults, "rdzv", epoch);
      Status w = wait_closed(epoch);
      if (!w.ok())
        return Status::Unavailable(fmt::format("elastic: round {} was never closed (its leader gone?): {}", epoch,
                                               w.message()));
      ASSIGN_OR_RETURN(std::string closed, store_.get(key(epoch, "closed")));
      if (closed.rfind("fail:", 0) == 0) return Status::ResourceExhausted(closed.substr(5));
      if (closed.rfind("abandoned:", 0) == 0)
        return Status::Unavailable(fmt::format("elastic: round {} {}", epoch, closed));
      size = std::atoi(closed.c_str());
    }
    if (slot >= size) {  // joined after the leader counted max: the next round
      epoch++;
      continue;
    }
    // The members, survivors first in their old order, then the new ones in
    // the order they joined.
    std::vector<std::string> keys;
    for (int s = 0; s < size; s++) keys.push_back(key(epoch, fmt::format("m{}", s)));
    Status records = store_.wait(keys, kRecordWait);
    if (!records.ok()) {
      if (records.code() != StatusCode::kUnavailable) return records;
      std::string missing;
      for (int s = 0; s < size; s++)
        if (store_.get(keys[s]).status().code() == StatusCode::kNotFound)
          missing += fmt::format("{}{}", missing.empty() ? "" : ", ", s);
      if (missing.empty()) return records;  // the store itself failed
      return Status::Unavailable(fmt::format(
          "elastic: round {} abandoned: no record from slot(s) {} of {} within {} s of its close (a member died "
          "after joining)",
          epoch, missing, size, std::chrono::duration_cast<std::chrono::seconds>(kRecordWait).count()));
    }
    struct Entry {
      int64_t order;
      int slot;
      Member m;
    };
    std::vector<Entry> entries;
    for (int s = 0; s < size; s++) {
      ASSIGN_OR_RETURN(std::string rec, store_.get(keys[s]));
      Entry e;
      e.slot = s;
      const size_t sp = rec.find(' ');
      e.m.prev_rank = std::atoi(rec.substr(0, sp).c_str());
      e.m.id = sp == std::string::npos ? "?" : rec.substr(sp + 1);
      e.order = e.m.prev_rank >= 0 ? e.m.prev_rank : (int64_t{1} << 32) + s;
      entries.push_back(std::move(e));
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.order < b.order; });
    Round r;
    r.epoch = epoch;
    r.size = size;
    for (int i = 0; i < size; i++) {
      if (entries[i].slot == slot) r.rank = i;
      r.members.push_back(entries[i].m);
    }
    comm::GlooConnect connect;
    connect.timeout = connect_timeout;
    for (const Member& m : r.members) connect.names.push_back(m.id);
    ASSIGN_OR_RETURN(r.comm, comm::make_gloo_communicator(store_, key(epoch, "gloo/"), r.rank, size, o_.host,
                                                          comm_options, "dp", connect));
    return r;
  }
}

}  // namespace tessera::elastic

#include "elastic/rendezvous.h"

#include <algorithm>
#include <chrono>
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
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

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
  while (true) {
    ASSIGN_OR_RETURN(int64_t n, store_.add(key(epoch, "count"), 0));
    if (n >= o_.min && !reached_min) reached_min = Clock::now();
    if (n >= o_.max || (reached_min && since(*reached_min) >= o_.last_call_s)) break;
    if (!reached_min && since(t0) >= o_.timeout_s) {
      const std::string why = fmt::format(
          "elastic: only {} of the minimum {} workers joined round {} of job '{}' within {:.0f} s (--min, "
          "--rdzv-timeout)",
          n, o_.min, epoch, o_.job, o_.timeout_s);
      RETURN_IF_ERROR(store_.set(key(epoch, "closed"), "fail:" + why));
      // A failed round counts as closed: a job restarted under the same id
      // (--resume, an external store that outlives the job) starts past it.
      RETURN_IF_ERROR(store_.set(o_.job + "/last", std::to_string(epoch)));
      return Status::ResourceExhausted(why);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSIGN_OR_RETURN(int64_t closed, store_.add(key(epoch, "count"), kClosedBias));
  const int size = static_cast<int>(std::min<int64_t>(closed - kClosedBias, o_.max));
  RETURN_IF_ERROR(store_.set(key(epoch, "closed"), std::to_string(size)));
  RETURN_IF_ERROR(store_.set(o_.job + "/last", std::to_string(epoch)));
  return size;
}

Result<Round> Rendezvous::join(int64_t epoch, int prev_rank, const comm::CommOptions& comm_options) {
  const auto wait_close = std::chrono::milliseconds(static_cast<int64_t>((o_.timeout_s + o_.last_call_s + 30) * 1e3));
  while (true) {
    ASSIGN_OR_RETURN(int64_t n, store_.add(key(epoch, "count"), 1));
    if (n > kClosedBias) {  // closed without this worker: the next round
      epoch++;
      continue;
    }
    const int slot = static_cast<int>(n - 1);
    RETURN_IF_ERROR(store_.set(key(epoch, fmt::format("m{}", slot)), fmt::format("{} {}", prev_rank, id_)));
    int size = 0;
    if (slot == 0) {
      ASSIGN_OR_RETURN(size, lead(epoch));
    } else {
      Status w = store_.wait({key(epoch, "closed")}, wait_close);
      if (!w.ok())
        return Status::Unavailable(fmt::format("elastic: round {} was never closed (its leader gone?): {}", epoch,
                                               w.message()));
      ASSIGN_OR_RETURN(std::string closed, store_.get(key(epoch, "closed")));
      if (closed.rfind("fail:", 0) == 0) return Status::ResourceExhausted(closed.substr(5));
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
    RETURN_IF_ERROR(store_.wait(keys, wait_close));
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
    ASSIGN_OR_RETURN(r.comm, comm::make_gloo_communicator(store_, key(epoch, "gloo/"), r.rank, size, o_.host,
                                                          comm_options, "dp"));
    return r;
  }
}

}  // namespace tessera::elastic

// Elastic rendezvous rounds over the embedded store (in this process): a
// round below min fails with the documented line and counts as closed, so
// a job restarted under the same id (an external store outlives its jobs)
// starts past it instead of failing at once in the old round; a leader that
// stalled past the timeout while its members abandoned the round leaves
// their verdict and the job's last round alone.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "comm/rendezvous/tcp_store.h"
#include "elastic/rendezvous.h"

namespace tessera::elastic {
namespace {

using std::chrono::milliseconds;

TEST(Rendezvous, BelowMinFailsAndARestartedJobStartsPastIt) {
  auto server = comm::StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto store = comm::StoreClient::connect("127.0.0.1", (*server)->port(), milliseconds(5000));
  ASSERT_TRUE(store.ok());
  RendezvousOptions o;
  o.job = "j";
  o.min = 2;
  o.max = 2;
  o.last_call_s = 0;
  o.timeout_s = 0.2;
  o.host = "127.0.0.1";
  comm::CommOptions co;
  co.timeout = milliseconds(5000);
  {
    Rendezvous r(**store, o, "h:1");
    ASSERT_EQ(r.first_epoch().value(), 0);
    Result<Round> round = r.join(0, -1, co);
    ASSERT_EQ(round.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(round.status().message().find("only 1 of the minimum 2 workers joined round 0 of job 'j'"),
              std::string::npos)
        << round.status().message();
  }
  // The same job id again, now with min 1: round 1, not the failed round 0.
  o.min = 1;
  o.max = 1;
  Rendezvous again(**store, o, "h:2");
  ASSERT_EQ(again.first_epoch().value(), 1);
  Result<Round> round = again.join(1, -1, co);
  ASSERT_TRUE(round.ok()) << round.status().message();
  EXPECT_EQ(round->epoch, 1);
  EXPECT_EQ(round->size, 1);
  EXPECT_EQ(round->rank, 0);
}

// A store in front of the embedded one that plays the other workers: the
// leader's read of round 0's counter (below min) is answered only after
// the rendezvous timeout, and meanwhile a member joins, takes the stalled
// leader for dead, abandons round 0, and the job goes on in round 1 (it
// closes: JOB/last = 1). The read returns the stale count.
class StallingStore : public comm::Store {
 public:
  explicit StallingStore(comm::Store& s) : s_(s) {}
  Status set(const std::string& k, const std::string& v) override { return s_.set(k, v); }
  Result<std::string> get(const std::string& k) override { return s_.get(k); }
  Result<int64_t> add(const std::string& k, int64_t d) override {
    Result<int64_t> r = s_.add(k, d);
    if (k != "j/r0/count" || d != 0 || played_) return r;
    played_ = true;
    std::this_thread::sleep_for(milliseconds(300));  // past timeout_s
    EXPECT_TRUE(s_.add(k, 1).ok());                  // the member joins,
    EXPECT_TRUE(s_.add(k, int64_t{1} << 40).ok());   // abandons the round
    EXPECT_TRUE(s_.set("j/r0/closed", "abandoned: its leader was silent for 5 s").ok());
    EXPECT_TRUE(s_.set("j/last", "1").ok());  // and closes round 1 without it
    return r;
  }
  std::string address() const override { return s_.address(); }
  std::string local_address() const override { return s_.local_address(); }

 private:
  comm::Store& s_;
  bool played_ = false;
};

TEST(Rendezvous, ALeaderThatStalledPastTheTimeoutDoesNotFailAnAbandonedRound) {
  auto server = comm::StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto client = comm::StoreClient::connect("127.0.0.1", (*server)->port(), milliseconds(5000));
  ASSERT_TRUE(client.ok());
  StallingStore store(**client);
  RendezvousOptions o;
  o.job = "j";
  o.min = 2;
  o.max = 2;
  o.last_call_s = 0;
  o.timeout_s = 0.2;
  o.host = "127.0.0.1";
  comm::CommOptions co;
  co.timeout = milliseconds(5000);
  Rendezvous r(store, o, "h:1");
  Result<Round> round = r.join(0, -1, co);
  // Not the job's failure: the round is the members' to decide, and they
  // went on; this worker joins a later round.
  EXPECT_EQ(round.status().code(), StatusCode::kUnavailable) << round.status().message();
  EXPECT_EQ((*client)->get("j/r0/closed").value(), "abandoned: its leader was silent for 5 s");
  EXPECT_EQ((*client)->get("j/last").value(), "1");  // not back to the abandoned round 0
  EXPECT_EQ(r.first_epoch().value(), 2);
}

}  // namespace
}  // namespace tessera::elastic

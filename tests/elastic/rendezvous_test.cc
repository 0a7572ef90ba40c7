// Elastic rendezvous rounds over the embedded store (in this process): a
// round below min fails with the documented line and counts as closed, so
// a job restarted under the same id (an external store outlives its jobs)
// starts past it instead of failing at once in the old round.
#include <chrono>

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

}  // namespace
}  // namespace tessera::elastic

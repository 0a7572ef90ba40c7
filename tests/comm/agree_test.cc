// comm::agree on N ranks as threads (comm/local/thread_communicator.h): every
// rank gets the same outcome, with the failure's code and the lowest failing
// rank and its host named; and the thread communicator's own collectives.
#include "comm/agree.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/local/self_communicator.h"
#include "comm/local/thread_communicator.h"

namespace tessera::comm {
namespace {

// Each rank's outcome of agree(mine(rank)).
std::vector<Status> agree_on(int n, const std::function<Status(int)>& mine) {
  std::vector<Status> out(static_cast<size_t>(n));
  run_ranks(n, [&](Communicator& c) { out[static_cast<size_t>(c.rank())] = agree(c, mine(c.rank())); });
  return out;
}

TEST(Agree, EveryRankOkIsOk) {
  for (int n : {1, 2, 3, 5}) {
    for (const Status& s : agree_on(n, [](int) { return Status::OK(); })) EXPECT_TRUE(s.ok()) << n << ": " << s.message();
  }
}

TEST(Agree, OneFailureIsEveryRanksWithItsCode) {
  setenv("TESSERA_HOST", "host-a", 1);
  std::vector<Status> got =
      agree_on(4, [](int r) { return r == 2 ? Status::Unavailable("the store went away") : Status::OK(); });
  unsetenv("TESSERA_HOST");
  for (int r = 0; r < 4; r++) {
    const Status& s = got[static_cast<size_t>(r)];
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << r;
    if (r == 2) {
      EXPECT_EQ(s.message(), "the store went away");  // the failing rank's own status, unchanged
    } else {
      EXPECT_EQ(s.message(), "rank 2 on host host-a: the store went away") << r;
    }
  }
}

TEST(Agree, TheLowestFailingRankIsNamed) {
  std::vector<Status> got = agree_on(5, [](int r) {
    if (r == 1) return Status::InvalidArgument("bad path");
    if (r == 3) return Status::IOError("disk full");
    return Status::OK();
  });
  for (int r : {0, 2, 3, 4}) {
    EXPECT_EQ(got[static_cast<size_t>(r)].code(), StatusCode::kInvalidArgument) << r;
    EXPECT_NE(got[static_cast<size_t>(r)].message().find("rank 1 on host "), std::string::npos);
    EXPECT_NE(got[static_cast<size_t>(r)].message().find(": bad path"), std::string::npos);
  }
  // Rank 3's own failure gives way to rank 1's: the same code on every rank
  // (a user error ends every rank cleanly, not one of them by an abort).
  EXPECT_EQ(got[1].message(), "bad path");
}

TEST(Agree, EveryCodeSurvives) {
  for (StatusCode code : {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kCorruption,
                          StatusCode::kIOError, StatusCode::kUnavailable, StatusCode::kInternal,
                          StatusCode::kResourceExhausted}) {
    std::vector<Status> got = agree_on(2, [code](int r) {
      if (r == 0) return Status::OK();
      switch (code) {
        case StatusCode::kInvalidArgument: return Status::InvalidArgument("x");
        case StatusCode::kNotFound: return Status::NotFound("x");
        case StatusCode::kCorruption: return Status::Corruption("x");
        case StatusCode::kIOError: return Status::IOError("x");
        case StatusCode::kUnavailable: return Status::Unavailable("x");
        case StatusCode::kResourceExhausted: return Status::ResourceExhausted("x");
        default: return Status::Internal("x");
      }
    });
    EXPECT_EQ(got[0].code(), code);
    EXPECT_EQ(got[1].code(), code);
  }
}

TEST(Agree, AnEmptyOrHugeMessageArrivesBounded) {
  std::vector<Status> got = agree_on(3, [](int r) {
    return r == 0 ? Status::Internal(std::string(200000, 'x')) : r == 1 ? Status::Internal("") : Status::OK();
  });
  EXPECT_EQ(got[2].code(), StatusCode::kInternal);
  EXPECT_LE(got[2].message().size(), size_t{64} << 10);
  EXPECT_EQ(got[2].message().rfind("rank 0 on host ", 0), 0u);
}

TEST(Agree, OneRankReturnsItsOwnStatus) {
  std::unique_ptr<Communicator> self = self_communicator();
  EXPECT_TRUE(agree(*self, Status::OK()).ok());
  Status s = agree(*self, Status::NotFound("no such file"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no such file");
}

TEST(Agree, ManyRoundsInARowStayInStep) {
  // Rounds with and without failures: the broadcasts of a failed round do
  // not leak into the next one.
  run_ranks(3, [](Communicator& c) {
    for (int round = 0; round < 20; round++) {
      const int bad = round % 4 == 3 ? round % 3 : -1;
      Status s = agree(c, c.rank() == bad ? Status::IOError(fmt::format("round {}", round)) : Status::OK());
      if (bad < 0) {
        EXPECT_TRUE(s.ok()) << round;
      } else {
        EXPECT_EQ(s.code(), StatusCode::kIOError) << round;
        EXPECT_NE(s.message().find(fmt::format("round {}", round)), std::string::npos);
      }
    }
  });
}

TEST(ThreadCommunicator, CollectivesOnEveryCount) {
  for (int n : {1, 2, 3, 4}) {
    run_ranks(n, [n](Communicator& c) {
      for (int64_t count : {0, 1, 7}) {
        std::vector<int64_t> v(static_cast<size_t>(count), c.rank() + 1);
        ASSERT_TRUE(c.all_reduce(v.data(), v.data(), count, ElemType::kI64).ok());
        for (int64_t x : v) EXPECT_EQ(x, n * (n + 1) / 2);
        std::vector<int32_t> gathered(static_cast<size_t>(count * n), -1), mine(static_cast<size_t>(count), c.rank());
        ASSERT_TRUE(c.all_gather(mine.data(), gathered.data(), count, ElemType::kI32).ok());
        for (int64_t i = 0; i < count * n; i++) EXPECT_EQ(gathered[static_cast<size_t>(i)], i / count);
        std::vector<float> b(static_cast<size_t>(count), c.rank() == n - 1 ? 2.5f : 0.0f);
        ASSERT_TRUE(c.broadcast(b.data(), count, ElemType::kF32, n - 1).ok());
        for (float x : b) EXPECT_EQ(x, 2.5f);
        std::vector<double> rs_in(static_cast<size_t>(count * n), 1.0), rs_out(static_cast<size_t>(count), 0.0);
        ASSERT_TRUE(c.reduce_scatter(rs_in.data(), rs_out.data(), count, ElemType::kF64, ReduceOp::kSum).ok());
        for (double x : rs_out) EXPECT_EQ(x, n);
      }
    });
  }
}

TEST(ThreadCommunicator, SendRecvAndBadArguments) {
  run_ranks(2, [](Communicator& c) {
    const int peer = 1 - c.rank();
    int32_t out = 10 + c.rank(), in = -1;
    ASSERT_TRUE(c.send(&out, sizeof(out), peer, 5).ok());
    ASSERT_TRUE(c.recv(&in, sizeof(in), peer, 5).ok());
    EXPECT_EQ(in, 10 + peer);
    EXPECT_EQ(c.send(&out, sizeof(out), 2, 5).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c.broadcast(&out, 1, ElemType::kI32, 7).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c.split(0, 0, "x").status().code(), StatusCode::kInvalidArgument);
  });
}

TEST(ThreadCommunicator, ARankLeftAloneTimesOut) {
  ThreadHub hub(2, std::chrono::milliseconds(100));
  ThreadCommunicator c(hub, 0);
  int32_t x = 1;
  Status s = c.all_reduce(&x, &x, 1, ElemType::kI32);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("timed out"), std::string::npos);
  EXPECT_EQ(c.recv(&x, sizeof(x), 1, 3).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tessera::comm

// The clock-offset estimate of the timeline trace (train/tracing.h).
#include "train/tracing.h"

#include <cstdlib>
#include <vector>

#include <gtest/gtest.h>

#include "comm/local/self_communicator.h"

namespace tessera {
namespace {

TEST(ClockOffset, TakesTheSampleWithTheSmallestRoundTrip) {
  // This rank's clock is 1000 ns behind rank 0's. A slow sample (a queued
  // answer) would say 1000 + 400; the fastest one says 1000 within +-50.
  std::vector<ClockSample> s = {{0, 1000 + 100 + 400, 200}, {1000, 2000 + 50, 1100}, {5000, 6000 + 300, 5700}};
  ClockOffset o = estimate_clock_offset(s);
  EXPECT_EQ(o.offset_ns, 1000);
  EXPECT_EQ(o.rtt_ns, 100);
  EXPECT_EQ(o.error_ns, 50);
}

TEST(ClockOffset, AsymmetricPathsStayWithinHalfTheRoundTrip) {
  // The answer is sent at the very start of the round trip (all the delay
  // on the way back): the estimate is off by rtt/2 and no more.
  const int64_t true_offset = -250000;
  std::vector<ClockSample> s = {{10000, 10000 + true_offset, 10800}};
  ClockOffset o = estimate_clock_offset(s);
  EXPECT_LE(std::llabs(o.offset_ns - true_offset), o.error_ns);
  EXPECT_EQ(o.error_ns, 400);
}

TEST(ClockOffset, NoSamplesIsZero) {
  ClockOffset o = estimate_clock_offset({});
  EXPECT_EQ(o.offset_ns, 0);
  EXPECT_EQ(o.rtt_ns, 0);
}

TEST(ClockOffset, OneRankMeasuresNothing) {
  auto self = comm::self_communicator();
  Result<ClockOffset> o = measure_clock_offset(*self);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->offset_ns, 0);
}

}  // namespace
}  // namespace tessera

// GradientReducer on N ranks as threads (comm/local/thread_communicator.h): buckets
// of spans average exactly what each rank holds, whatever the bucket size,
// and a group that never becomes ready is an error, not a hang.
#include "parallel/gradient_reducer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "comm/local/thread_communicator.h"
#include "aborting.h"

namespace tessera {
namespace {

using testing_util::make_gradient_reducer;

// Three ready groups over one buffer of 10 floats: {[0,4)}, {[4,5), [7,10)},
// {} ; floats [5,7) belong to no group and stay untouched.
std::vector<std::vector<GradSpan>> groups_over(float* g) {
  return {{{g, 4}}, {{g + 4, 1}, {g + 7, 3}}, {}};
}

TEST(GradientReducer, BucketsAverageAcrossRanksForAnyBucketSize) {
  for (int n : {1, 2, 3}) {
    for (int64_t bucket_bytes : {int64_t{1}, int64_t{16}, int64_t{1} << 20}) {
      SCOPED_TRACE(testing::Message() << n << " ranks, buckets of " << bucket_bytes << " bytes");
      std::atomic<int> failures{0};
      comm::run_ranks(n, [&](comm::Communicator& comm) {
        std::vector<float> g(10);
        for (int i = 0; i < 10; i++) g[i] = static_cast<float>(comm.rank() * 100 + i);
        auto reducer = make_gradient_reducer(comm, groups_over(g.data()), {bucket_bytes, Device::kCPU});
        if (n > 1 && bucket_bytes == 1 && reducer->buckets() != 2) failures++;  // the empty group adds none
        if (n > 1 && bucket_bytes == (int64_t{1} << 20) && reducer->buckets() != 1) failures++;
        reducer->set_communicate(true);
        for (int group = 0; group < 3; group++) reducer->ready(group);
        if (!reducer->finish().ok()) failures++;
        const float mean_rank = (n - 1) / 2.0f;
        for (int i = 0; i < 10; i++) {
          const float want = (i == 5 || i == 6) ? comm.rank() * 100 + i : mean_rank * 100 + i;
          if (g[i] != want) failures++;
        }
      });
      EXPECT_EQ(failures.load(), 0);
    }
  }
}

TEST(GradientReducer, OnlyTheCommunicatingBackwardPostsBuckets) {
  std::atomic<int> failures{0};
  comm::run_ranks(2, [&](comm::Communicator& comm) {
    std::vector<float> g(10, static_cast<float>(comm.rank()));
    auto reducer = make_gradient_reducer(comm, groups_over(g.data()), {1 << 20, Device::kCPU});
    reducer->set_communicate(false);  // an accumulation micro-step
    for (int group = 0; group < 3; group++) reducer->ready(group);
    reducer->set_communicate(true);
    for (int group = 0; group < 3; group++) reducer->ready(group);
    if (!reducer->finish().ok()) failures++;
    if (g[0] != 0.5f) failures++;
  });
  EXPECT_EQ(failures.load(), 0);
}

TEST(GradientReducer, GroupNeverReadyIsAnError) {
  std::atomic<int> failures{0};
  comm::run_ranks(2, [&](comm::Communicator& comm) {
    std::vector<float> g(10, 1.0f);
    auto reducer = make_gradient_reducer(comm, groups_over(g.data()), {1, Device::kCPU});
    reducer->set_communicate(true);
    reducer->ready(0);  // group 1 (the second bucket's last) never comes
    Status st = reducer->finish();
    if (st.code() != StatusCode::kInternal) failures++;
  });
  EXPECT_EQ(failures.load(), 0);
}

TEST(GradientReducer, OneRankPlansNothing) {
  comm::run_ranks(1, [&](comm::Communicator& comm) {
    std::vector<float> g(10, 2.0f);
    auto reducer = make_gradient_reducer(comm, groups_over(g.data()), {1, Device::kCPU});
    EXPECT_EQ(reducer->buckets(), 0);
    EXPECT_TRUE(reducer->finish().ok());
    EXPECT_TRUE(reducer->reduce_scatter_flat(g.data(), 10).ok());
    EXPECT_EQ(g[3], 2.0f);
  });
}

}  // namespace
}  // namespace tessera

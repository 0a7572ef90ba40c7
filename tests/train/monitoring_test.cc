// The labels of a training rank's series, and the exporter's start-up:
// off at port 0, serving at port + local rank, one InvalidArgument line
// when the port is taken.
#include "train/monitoring.h"

#include <httplib.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "comm/local/self_communicator.h"

namespace tessera {
namespace {

TEST(Monitoring, RankLabelsNameTheRankItsCoordinatesHostAndJob) {
  TrainConfig c;
  c.job = "gpt2-small";
  setenv("TESSERA_HOST", "h7", 1);
  const obs::Labels l = rank_labels(c, 5, comm::MeshCoord{1, 0, 2});
  unsetenv("TESSERA_HOST");
  EXPECT_EQ(l, (obs::Labels{{"rank", "5"}, {"dp", "1"}, {"tp", "0"}, {"pp", "2"}, {"host", "h7"}, {"job", "gpt2-small"}}));
  c.job.clear();
  bool has_default_job = false;
  const obs::Labels defaults = rank_labels(c, 0, {});
  for (const auto& [k, v] : defaults.pairs()) has_default_job |= k == "job" && v == "tessera";
  EXPECT_TRUE(has_default_job);
}

TEST(Monitoring, PortZeroIsOff) {
  TrainConfig c;
  auto world = comm::self_communicator();
  obs::Registry r;
  auto e = start_metrics_exporter(c, *world, r);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(*e, nullptr);
}

TEST(Monitoring, ServesOnThePortAndRefusesItTwiceInOneLine) {
  auto world = comm::self_communicator();
  obs::Registry r;
  // A free port: bind any, note it, release it.
  int port = 0;
  {
    obs::MetricsExporter probe(r);
    ASSERT_TRUE(probe.start("127.0.0.1", 0).ok());
    port = probe.port();
  }
  TrainConfig c;
  c.metrics_port = port;  // local rank 0 without a launcher
  auto first = start_metrics_exporter(c, *world, r);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_NE(*first, nullptr);
  EXPECT_EQ((*first)->port(), port);
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);

  auto second = start_metrics_exporter(c, *world, r);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = second.status().message();
  EXPECT_NE(m.find("cannot serve metrics on 127.0.0.1:" + std::to_string(port)), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

}  // namespace
}  // namespace tessera

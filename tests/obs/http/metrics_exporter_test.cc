// The exporter serves the registry at /metrics while it runs, refuses a
// port another process (or exporter) holds, and frees it when stopped.
#include "obs/http/metrics_exporter.h"

#include <httplib.h>

#include <string>

#include <gtest/gtest.h>

namespace tessera::obs {
namespace {

TEST(MetricsExporter, ServesTheRegistryWithProcessMetrics) {
  Registry r;
  r.set_const_labels({{"rank", "0"}});
  r.counter("tessera_train_steps_total", "Optimizer steps completed").add(7);
  MetricsExporter e(r);
  ASSERT_TRUE(e.start("127.0.0.1", 0).ok());
  ASSERT_GT(e.port(), 0);
  httplib::Client c("127.0.0.1", e.port());
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(res->body.find("tessera_train_steps_total{rank=\"0\"} 7\n"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("process_cpu_seconds_total{rank=\"0\"} "), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("process_resident_memory_bytes{rank=\"0\"} "), std::string::npos) << res->body;
  // Updates show in the next scrape.
  r.counter("tessera_train_steps_total", "").add(1);
  res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("tessera_train_steps_total{rank=\"0\"} 8\n"), std::string::npos) << res->body;
  res = c.Get("/other");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

TEST(MetricsExporter, APortInUseIsRefusedNamingTheAddress) {
  Registry r;
  MetricsExporter first(r);
  ASSERT_TRUE(first.start("127.0.0.1", 0).ok());
  MetricsExporter second(r);
  Status st = second.start("127.0.0.1", first.port());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << st.message();
}

TEST(MetricsExporter, StopFreesThePortAtOnce) {
  Registry r;
  int port = 0;
  {
    MetricsExporter e(r);
    ASSERT_TRUE(e.start("127.0.0.1", 0).ok());
    port = e.port();
    httplib::Client c("127.0.0.1", port);
    ASSERT_TRUE(c.Get("/metrics"));  // a connection served and closed
    e.stop();
    e.stop();  // idempotent
    httplib::Client late("127.0.0.1", port);
    late.set_connection_timeout(1, 0);
    EXPECT_FALSE(late.Get("/metrics"));
  }
  MetricsExporter again(r);  // SO_REUSEADDR: rebinds despite TIME_WAIT
  EXPECT_TRUE(again.start("127.0.0.1", port).ok());
}

TEST(MetricsExporter, StopRightAfterStartIsNotLost) {
  Registry r;
  for (int i = 0; i < 20; i++) {
    MetricsExporter e(r);
    ASSERT_TRUE(e.start("127.0.0.1", 0).ok());
  }  // each destructor stops and joins; a lost stop() would hang here
}

}  // namespace
}  // namespace tessera::obs

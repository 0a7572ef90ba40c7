// The dashboard's computations (obs/prom_text.h, obs/dashboard.h): reading
// Prometheus text, histogram quantiles, the values of a target and every
// alert rule firing and not. The served page is in tests/cli/dashboard.sh.
#include "obs/dashboard.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "obs/metrics.h"
#include "obs/prom_text.h"

namespace tessera::obs {
namespace {

using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(PromText, ReadsRealExpositionText) {
  const std::string text =
      "# HELP tessera_serve_requests_total Requests\n"
      "# TYPE tessera_serve_requests_total counter\n"
      "tessera_serve_requests_total{code=\"200\",path=\"/v1/completions\"} 12\n"
      "\n"
      "tessera_train_loss 2.5\n"
      "tessera_x{path=\"say \\\"hi\\\" \\\\ \\n\"} 1 1700000000000\n"
      "step_seconds_bucket{le=\"+Inf\",rank=\"0\"} 7\n"
      "tessera_gpu_utilization_ratio NaN\n"
      "tessera_neg -Inf\n"
      "  tessera_indented{a = \"1\" , b=\"{}\",} 3e-2\n";
  int bad = -1;
  const std::vector<PromSample> s = parse_prometheus_text(text, &bad);
  EXPECT_EQ(bad, 0);
  ASSERT_EQ(s.size(), 7u);
  EXPECT_EQ(s[0].name, "tessera_serve_requests_total");
  EXPECT_EQ(s[0].labels.at("code"), "200");
  EXPECT_EQ(s[0].labels.at("path"), "/v1/completions");
  EXPECT_EQ(s[0].value, 12);
  EXPECT_EQ(s[1].name, "tessera_train_loss");
  EXPECT_TRUE(s[1].labels.empty());
  EXPECT_EQ(s[1].value, 2.5);
  EXPECT_EQ(s[2].labels.at("path"), "say \"hi\" \\ \n");  // escapes undone; the timestamp ignored
  EXPECT_EQ(s[2].value, 1);
  EXPECT_EQ(s[3].labels.at("le"), "+Inf");
  EXPECT_EQ(s[3].value, 7);
  EXPECT_TRUE(std::isnan(s[4].value));
  EXPECT_EQ(s[5].value, -kInf);
  EXPECT_EQ(s[6].name, "tessera_indented");
  EXPECT_EQ(s[6].labels.at("a"), "1");
  EXPECT_EQ(s[6].labels.at("b"), "{}");
  EXPECT_DOUBLE_EQ(s[6].value, 0.03);
}

TEST(PromText, ReadsWhatTheRegistryWrites) {
  Registry r;
  r.counter("tessera_c_total", "C", {{"path", "a\"b\\c"}}).add(3);
  r.histogram("tessera_h_seconds", "H", {0.1, 1}).observe(0.5);
  int bad = -1;
  const std::vector<PromSample> s = parse_prometheus_text(r.render_prometheus(), &bad);
  EXPECT_EQ(bad, 0);
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s[0].name, "tessera_c_total");
  EXPECT_EQ(s[0].labels.at("path"), "a\"b\\c");
  EXPECT_EQ(s[0].value, 3);
  int buckets = 0;
  for (const PromSample& x : s) buckets += x.name == "tessera_h_seconds_bucket";
  EXPECT_EQ(buckets, 3);
}

TEST(PromText, MalformedLinesAreSkippedAndCounted) {
  const std::string text =
      "good 1\n"
      "no_value\n"
      "no_value_after_labels{a=\"1\"}\n"
      "unclosed{a=\"1\" 2\n"
      "unquoted{a=1} 2\n"
      "open_quote{a=\"1} 2\n"
      "not_a_number abc\n"
      "trailing 1 2 3\n"
      "{a=\"1\"} 2\n"
      "\\\n"
      "also_good{a=\"x\"} 2";  // no newline at the end
  int bad = -1;
  const std::vector<PromSample> s = parse_prometheus_text(text, &bad);
  EXPECT_EQ(bad, 9);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "good");
  EXPECT_EQ(s[1].name, "also_good");
  EXPECT_TRUE(parse_prometheus_text("").empty());
  EXPECT_TRUE(parse_prometheus_text("# only a comment").empty());
}

TEST(BucketQuantile, LinearWithinTheBucket) {
  // 10 observations: 2 <= 0.1, 6 <= 0.5, 9 <= 1, 10 in all.
  const std::vector<std::pair<double, double>> b = {{1, 9}, {0.1, 2}, {kInf, 10}, {0.5, 6}};  // any order
  // p50: rank 5, in (0.1, 0.5] holding 2..6: 0.1 + 0.4 * (5 - 2) / 4 = 0.4.
  EXPECT_DOUBLE_EQ(bucket_quantile(b, 0.5), 0.4);
  // p90: rank 9, in (0.5, 1] holding 6..9: 0.5 + 0.5 * 3 / 3 = 1.
  EXPECT_DOUBLE_EQ(bucket_quantile(b, 0.9), 1.0);
  // p10: rank 1, in [0, 0.1] holding 0..2: 0.05.
  EXPECT_DOUBLE_EQ(bucket_quantile(b, 0.1), 0.05);
  // p95: rank 9.5, in the +Inf bucket: the largest finite bound.
  EXPECT_DOUBLE_EQ(bucket_quantile(b, 0.95), 1.0);
  EXPECT_DOUBLE_EQ(bucket_quantile(b, 0), 0.0);
}

TEST(BucketQuantile, EmptyAndSingleBucket) {
  EXPECT_TRUE(std::isnan(bucket_quantile({}, 0.5)));
  EXPECT_TRUE(std::isnan(bucket_quantile({{0.1, 0}, {kInf, 0}}, 0.5)));  // no observations
  EXPECT_DOUBLE_EQ(bucket_quantile({{2, 4}}, 0.5), 1.0);                 // rank 2 of 4 in [0, 2]
  EXPECT_DOUBLE_EQ(bucket_quantile({{kInf, 4}}, 0.5), 0.0);              // only +Inf: no finite bound
}

TEST(BucketQuantile, NaNBucketsAreIgnored) {
  const double nan = std::nan("");
  EXPECT_DOUBLE_EQ(bucket_quantile({{nan, 3}, {1, 4}, {0.5, nan}, {kInf, 4}}, 0.5), 0.5);
  EXPECT_TRUE(std::isnan(bucket_quantile({{nan, nan}}, 0.5)));
}

TEST(TargetValues, KeysLabelsAndQuantiles) {
  const json v = target_values(
      "tessera_train_steps_total{rank=\"0\",host=\"a\"} 5\n"
      "tessera_train_comm_bus_bandwidth_bytes_per_second{op=\"all_reduce\",rank=\"0\"} 4e9\n"
      "tessera_train_link_speed_bytes_per_second{link=\"eth0\"} 1e10\n"
      "tessera_gpu_utilization_ratio{gpu=\"0\"} 0.5\n"
      "tessera_gpu_utilization_ratio{gpu=\"1\"} 0.7\n"
      "process_resident_memory_bytes 1e6\n"
      "go_goroutines 7\n"
      "tessera_serve_ttft_seconds_bucket{le=\"0.1\"} 2\n"
      "tessera_serve_ttft_seconds_bucket{le=\"0.5\"} 6\n"
      "tessera_serve_ttft_seconds_bucket{le=\"+Inf\"} 10\n"
      "tessera_serve_empty_seconds_bucket{le=\"+Inf\"} 0\n"
      "tessera_serve_nole_bucket 3\n");
  EXPECT_EQ(v["tessera_train_steps_total"], 5.0);
  EXPECT_EQ(v["tessera_train_comm_bus_bandwidth_bytes_per_second{op=all_reduce}"], 4e9);
  EXPECT_EQ(v["tessera_train_link_speed_bytes_per_second{link=eth0}"], 1e10);
  EXPECT_EQ(v["tessera_train_link_speed_bytes_per_second"], 1e10);
  EXPECT_EQ(v["tessera_gpu_utilization_ratio"], 0.5);  // the first
  EXPECT_EQ(v["tessera_gpu_utilization_ratio{gpu=1}"], 0.7);
  EXPECT_EQ(v["process_resident_memory_bytes"], 1e6);
  EXPECT_FALSE(v.contains("go_goroutines"));
  EXPECT_DOUBLE_EQ(v["tessera_serve_ttft_seconds:p50"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(v["tessera_serve_ttft_seconds:p90"].get<double>(), 0.5);
  EXPECT_FALSE(v.contains("tessera_serve_empty_seconds:p50"));
  EXPECT_FALSE(v.contains("tessera_serve_nole"));
  EXPECT_FALSE(v.contains("tessera_serve_nole_bucket"));
}

// A run as read_run returns it.
json run(const json& steps, const json& checkpoints = json::array()) {
  return {{"name", "r"}, {"found", true}, {"steps", steps}, {"evals", json::array()}, {"checkpoints", checkpoints}};
}

json find_alert(const json& alerts, const std::string& name, const std::string& target) {
  for (const json& a : alerts)
    if (a["alert"] == name && a["target"] == target) return a;
  return json();
}

TEST(DashboardAlerts, CheckpointShare) {
  AlertThresholds t;
  json a = dashboard_alerts(json::array({run(json::array())}), json::array(), t);
  EXPECT_EQ(find_alert(a, "checkpoint_share", "r")["state"], "ok");
  EXPECT_EQ(find_alert(a, "checkpoint_share", "r")["detail"], "no checkpoint taken");
  a = dashboard_alerts(json::array({run(json::array(), json::array({{{"checkpoint_step", 10}, {"stall_share", 0.2}},
                                                                     {{"checkpoint_step", 20}, {"stall_share", 0.01}}}))}),
                       json::array(), t);
  EXPECT_EQ(find_alert(a, "checkpoint_share", "r")["state"], "ok");  // the last checkpoint counts
  EXPECT_EQ(find_alert(a, "checkpoint_share", "r")["value"], 0.01);
  a = dashboard_alerts(json::array({run(json::array(), json::array({{{"checkpoint_step", 10}, {"stall_share", 0.2}}}))}),
                       json::array(), t);
  EXPECT_EQ(find_alert(a, "checkpoint_share", "r")["state"], "firing");
  EXPECT_EQ(find_alert(a, "checkpoint_share", "r")["detail"],
            "checkpoints stalled 20.0% of training time (alert above 5.0%)");
}

TEST(DashboardAlerts, RunBusBandwidthFiresAfterConsecutiveSamples) {
  AlertThresholds t;  // below 50% of the link, 3 samples
  auto step = [](double busbw, double link) { return json{{"step", 1}, {"busbw_all_reduce_gbps", busbw}, {"link_gbps", link}}; };
  json two_low = json::array({step(9, 10), step(4, 10), step(4, 10)});
  json al = find_alert(dashboard_alerts(json::array({run(two_low)}), json::array(), t), "allreduce_busbw", "r");
  EXPECT_EQ(al["state"], "ok");
  EXPECT_DOUBLE_EQ(al["value"].get<double>(), 0.4);
  EXPECT_EQ(al["detail"], "all-reduce bus bandwidth, share of the link: 40.0% (2 consecutive samples below 50%; fires at 3)");
  json three_low = two_low;
  three_low.push_back(step(2, 10));
  al = find_alert(dashboard_alerts(json::array({run(three_low)}), json::array(), t), "allreduce_busbw", "r");
  EXPECT_EQ(al["state"], "firing");
  // Unknown: no all-reduce at all, or no link speed.
  al = find_alert(dashboard_alerts(json::array({run(json::array({{{"step", 1}, {"loss", 2}}}))}), json::array(), t),
                  "allreduce_busbw", "r");
  EXPECT_EQ(al["state"], "unknown");
  EXPECT_EQ(al["detail"], "no all-reduce between ranks recorded (a single-rank run)");
  al = find_alert(dashboard_alerts(json::array({run(json::array({{{"step", 1}, {"busbw_all_reduce_gbps", 3}}}))}),
                                   json::array(), t),
                  "allreduce_busbw", "r");
  EXPECT_EQ(al["state"], "unknown");
  EXPECT_EQ(al["detail"], "the link's speed is unknown (set log.link_gbps)");
}

TEST(DashboardAlerts, RunDeviceUtilization) {
  AlertThresholds t;
  t.samples = 2;
  auto util = [](double u) { return json{{"step", 1}, {"gpu_util", u}}; };
  json al = find_alert(dashboard_alerts(json::array({run(json::array({util(0.5), util(0.95)}))}), json::array(), t),
                       "device_utilization", "r");
  EXPECT_EQ(al["state"], "ok");
  al = find_alert(dashboard_alerts(json::array({run(json::array({util(0.95), util(0.5), util(0.6)}))}), json::array(), t),
                  "device_utilization", "r");
  EXPECT_EQ(al["state"], "firing");
  al = find_alert(dashboard_alerts(json::array({run(json::array())}), json::array(), t), "device_utilization", "r");
  EXPECT_EQ(al["state"], "unknown");
}

TEST(DashboardAlerts, TargetDownAndFailover) {
  AlertThresholds t;
  const json targets = json::array({{{"url", "http://a:1"}, {"error", "Connection"}},
                                    {{"url", "http://b:2"}, {"values", {{"tessera_route_tier_active{tier=gpu}", 0.0}}}},
                                    {{"url", "http://c:3"}, {"values", {{"tessera_route_tier_active{tier=gpu}", 1.0}}}}});
  const json a = dashboard_alerts(json::array(), targets, t);
  EXPECT_EQ(find_alert(a, "target_down", "http://a:1")["state"], "firing");
  EXPECT_EQ(find_alert(a, "target_down", "http://a:1")["detail"], "Connection");
  EXPECT_EQ(find_alert(a, "failover", "http://b:2")["state"], "firing");
  EXPECT_TRUE(find_alert(a, "failover", "http://c:3").is_null());
  EXPECT_EQ(a.size(), 2u);
}

TEST(DashboardAlerts, TargetStreaksCountNewStepsOnly) {
  AlertThresholds t;
  t.samples = 2;
  TargetHistory history;
  auto target = [](double steps, double busbw, double util) {
    return json::array({{{"url", "http://r:1"},
                         {"values",
                          {{"tessera_train_steps_total", steps},
                           {"tessera_train_link_speed_bytes_per_second", 10.0},
                           {"tessera_train_comm_bus_bandwidth_bytes_per_second{op=all_reduce}", busbw},
                           {"tessera_gpu_utilization_ratio", util}}}}});
  };
  json a = dashboard_alerts(json::array(), target(1, 3, 0.5), t, &history);
  EXPECT_EQ(find_alert(a, "allreduce_busbw", "http://r:1")["state"], "ok");
  EXPECT_EQ(find_alert(a, "device_utilization", "http://r:1")["state"], "ok");
  // The same step polled again is not a second sample.
  a = dashboard_alerts(json::array(), target(1, 3, 0.5), t, &history);
  EXPECT_EQ(find_alert(a, "allreduce_busbw", "http://r:1")["state"], "ok");
  a = dashboard_alerts(json::array(), target(2, 3, 0.5), t, &history);
  EXPECT_EQ(find_alert(a, "allreduce_busbw", "http://r:1")["state"], "firing");
  EXPECT_EQ(find_alert(a, "device_utilization", "http://r:1")["state"], "firing");
  a = dashboard_alerts(json::array(), target(3, 8, 0.95), t, &history);
  EXPECT_EQ(find_alert(a, "allreduce_busbw", "http://r:1")["state"], "ok");
  EXPECT_EQ(find_alert(a, "device_utilization", "http://r:1")["state"], "ok");
  // Without a history (a report), no streak alerts for targets.
  a = dashboard_alerts(json::array(), target(4, 3, 0.5), t);
  EXPECT_TRUE(a.empty());
  // A rank without the link's speed: unknown, saying why.
  const json no_link = json::array({{{"url", "http://s:1"}, {"values", {{"tessera_train_steps_total", 1.0}}}}});
  a = dashboard_alerts(json::array(), no_link, t, &history);
  EXPECT_EQ(find_alert(a, "allreduce_busbw", "http://s:1")["state"], "unknown");
  EXPECT_EQ(find_alert(a, "allreduce_busbw", "http://s:1")["detail"], "the link's speed is unknown (set log.link_gbps)");
  EXPECT_EQ(find_alert(a, "device_utilization", "http://s:1")["state"], "unknown");
}

TEST(DashboardRun, RecordsOfAMetricsFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessera_dashboard_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "metrics.jsonl");
    f << "{\"step\": 1, \"loss\": 3.0, \"tokens_per_s\": 100, \"other\": 1}\n"
         "{\"step\": 1, \"val_loss\": 3.5}\n"
         "{\"checkpoint_step\": 1, \"stall_share\": 0.1}\n"
         "not json\n"
         "{\"step\": 2, \"loss\": 2.";  // a line still being written
  }
  EXPECT_EQ(run_metrics_file(dir.string()), (dir / "metrics.jsonl").string());
  const json r = read_run(dir.string());
  EXPECT_EQ(r["found"], true);
  ASSERT_EQ(r["steps"].size(), 1u);
  EXPECT_EQ(r["steps"][0], (json{{"step", 1}, {"loss", 3.0}, {"tokens_per_s", 100}}));
  EXPECT_EQ(r["evals"][0], (json{{"step", 1}, {"val_loss", 3.5}}));
  EXPECT_EQ(r["checkpoints"].size(), 1u);
  EXPECT_EQ(read_run((dir / "missing.jsonl").string())["found"], false);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::obs

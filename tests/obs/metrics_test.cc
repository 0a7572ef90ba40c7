#include "obs/metrics.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace tessera::obs {
namespace {

TEST(Metrics, CounterAndGaugeRenderWithHelpAndType) {
  Registry r;
  r.counter("tessera_train_steps_total", "Optimizer steps completed").add(3);
  r.gauge("tessera_train_loss", "Training loss of the last step").set(2.5);
  EXPECT_EQ(r.render_prometheus(),
            "# HELP tessera_train_loss Training loss of the last step\n"
            "# TYPE tessera_train_loss gauge\n"
            "tessera_train_loss 2.5\n"
            "# HELP tessera_train_steps_total Optimizer steps completed\n"
            "# TYPE tessera_train_steps_total counter\n"
            "tessera_train_steps_total 3\n");
}

TEST(Metrics, LabelsAreSortedAndOneSeriesPerLabelSet) {
  Registry r;
  r.counter("requests_total", "Requests", {{"path", "/v1"}, {"code", "200"}}).add();
  r.counter("requests_total", "Requests", {{"code", "200"}, {"path", "/v1"}}).add();
  r.counter("requests_total", "Requests", {{"code", "500"}, {"path", "/v1"}}).add(2);
  EXPECT_EQ(r.render_prometheus(),
            "# HELP requests_total Requests\n"
            "# TYPE requests_total counter\n"
            "requests_total{code=\"200\",path=\"/v1\"} 2\n"
            "requests_total{code=\"500\",path=\"/v1\"} 2\n");
}

TEST(Metrics, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Registry r;
  Histogram& h = r.histogram("step_seconds", "Step time", {0.1, 0.5, 1}, {{"rank", "0"}});
  for (double x : {0.05, 0.1, 0.3, 2.0}) h.observe(x);  // 0.1 falls in le="0.1"
  EXPECT_EQ(r.render_prometheus(),
            "# HELP step_seconds Step time\n"
            "# TYPE step_seconds histogram\n"
            "step_seconds_bucket{rank=\"0\",le=\"0.1\"} 2\n"
            "step_seconds_bucket{rank=\"0\",le=\"0.5\"} 3\n"
            "step_seconds_bucket{rank=\"0\",le=\"1\"} 3\n"
            "step_seconds_bucket{rank=\"0\",le=\"+Inf\"} 4\n"
            "step_seconds_sum{rank=\"0\"} 2.45\n"
            "step_seconds_count{rank=\"0\"} 4\n");
}

TEST(Metrics, EmptyHistogramRendersZeros) {
  Registry r;
  r.histogram("x", "X", {1});
  EXPECT_EQ(r.render_prometheus(),
            "# HELP x X\n# TYPE x histogram\nx_bucket{le=\"1\"} 0\nx_bucket{le=\"+Inf\"} 0\nx_sum 0\nx_count 0\n");
}

TEST(Metrics, EscapesLabelValuesAndHelp) {
  Registry r;
  r.gauge("g", "line one\nback\\slash", {{"path", "a\"b\\c\nd"}}).set(1);
  EXPECT_EQ(r.render_prometheus(),
            "# HELP g line one\\nback\\\\slash\n# TYPE g gauge\ng{path=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(Metrics, SpecialValues) {
  EXPECT_EQ(format_metric_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_metric_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_metric_value(std::nan("")), "NaN");
  EXPECT_EQ(format_metric_value(0.001), "0.001");
  EXPECT_EQ(format_metric_value(1e21), "1e+21");
}

TEST(Metrics, SameSeriesReturnsSameObject) {
  Registry r;
  Gauge& a = r.gauge("g", "G", {{"k", "v"}});
  Gauge& b = r.gauge("g", "G", {{"k", "v"}});
  EXPECT_EQ(&a, &b);
  a.add(1.5);
  b.add(1.0);
  EXPECT_EQ(a.value(), 2.5);
}

TEST(Metrics, ConcurrentUpdatesLoseNothing) {
  Registry r;
  Counter& c = r.counter("c_total", "C");
  Histogram& h = r.histogram("h", "H", exponential_buckets(1, 2, 4));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; i++) {
        c.add();
        h.observe(3);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.snapshot().count, 40000u);
  EXPECT_EQ(h.snapshot().counts[2], 40000u);  // 2 < 3 <= 4
}

TEST(Metrics, ConstLabelsAreOnEverySeriesAndASeriesOwnLabelWins) {
  Registry r;
  r.set_const_labels({{"rank", "1"}, {"job", "j"}});
  r.counter("c_total", "C").add(2);
  r.gauge("g", "G", {{"kind", "params"}, {"job", "mine"}}).set(3);
  r.histogram("h", "H", {1}).observe(0.5);
  EXPECT_EQ(r.render_prometheus(),
            "# HELP c_total C\n# TYPE c_total counter\nc_total{job=\"j\",rank=\"1\"} 2\n"
            "# HELP g G\n# TYPE g gauge\ng{job=\"mine\",kind=\"params\",rank=\"1\"} 3\n"
            "# HELP h H\n# TYPE h histogram\nh_bucket{job=\"j\",rank=\"1\",le=\"1\"} 1\n"
            "h_bucket{job=\"j\",rank=\"1\",le=\"+Inf\"} 1\nh_sum{job=\"j\",rank=\"1\"} 0.5\n"
            "h_count{job=\"j\",rank=\"1\"} 1\n");
  // Not part of a series' identity: the unlabelled lookup is the same series.
  EXPECT_EQ(r.counter("c_total", "C").value(), 2);
}

TEST(Metrics, CounterAdvanceToNeverGoesDown) {
  Counter c;
  c.advance_to(5);
  EXPECT_EQ(c.value(), 5);
  c.advance_to(3);
  EXPECT_EQ(c.value(), 5);
  c.add(1);
  c.advance_to(5.5);
  EXPECT_EQ(c.value(), 6);
}

TEST(Metrics, ExponentialBuckets) {
  EXPECT_EQ(exponential_buckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
}

}  // namespace
}  // namespace tessera::obs

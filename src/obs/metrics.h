// A small metrics registry: counters, gauges and histograms with labels,
// shared by the trainer, the server and the Prometheus exporter (obs/http),
// and its rendering in the Prometheus text exposition format (version 0.0.4).
//
// A metric family (name, help, type) holds one series per label set; labels
// are a small list of key/value pairs kept sorted by key, so {a=1,b=2} and
// {b=2,a=1} are one series. Families and series are created on first use and
// live as long as the registry: the references returned stay valid, so a hot
// loop looks a series up once and then only updates it.
//
// Thread safety: every operation may be called from any thread. Counters and
// gauges are lock-free atomics (doubles, updated by compare-exchange);
// a histogram observation and a lookup take a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tessera::obs {

// Sorted by key on construction (duplicate keys: the last wins).
class Labels {
 public:
  Labels() = default;
  Labels(std::initializer_list<std::pair<std::string, std::string>> kv);
  const std::vector<std::pair<std::string, std::string>>& pairs() const { return kv_; }
  bool empty() const { return kv_.empty(); }
  // Both sets; where a key is in both, over's value wins.
  static Labels merge(const Labels& base, const Labels& over);
  auto operator<=>(const Labels&) const = default;

 private:
  std::vector<std::pair<std::string, std::string>> kv_;
};

// Monotonic; add() of a negative value is a bug (CHECK).
class Counter {
 public:
  void add(double x = 1.0);
  // For a counter that mirrors a total kept elsewhere (the kernel's CPU
  // time of the process): raises the value to `total`; a smaller total
  // leaves it as it is, so concurrent callers never make it go down.
  void advance_to(double total);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Gauge {
 public:
  void set(double x) { v_.store(x, std::memory_order_relaxed); }
  void add(double x);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

// Fixed upper bounds (increasing, +Inf implied); counts are per bucket here
// and cumulative when rendered, as Prometheus wants.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double x);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // bounds.size() + 1, the last for +Inf; not cumulative
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Bucket bounds start, start*factor, ... (n of them), for latencies.
std::vector<double> exponential_buckets(double start, double factor, int n);

enum class MetricType { kCounter, kGauge, kHistogram };

class Registry {
 public:
  // The series of family `name` with `labels`, created on first use. Asking
  // for an existing name with another type (or a histogram with other
  // bounds) is a bug (CHECK). Names must match [a-zA-Z_:][a-zA-Z0-9_:]*.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const Labels& labels = {});

  // Every family in name order, each series in label order:
  //   # HELP name help
  //   # TYPE name counter|gauge|histogram
  //   name{k="v"} value
  //   name_bucket{k="v",le="0.5"} n ... name_bucket{le="+Inf"} n, name_sum, name_count
  // Every series rendered also carries these labels (a series' own label
  // of the same key wins): who is speaking, e.g. a training rank's
  // {rank, dp, tp, pp, host, job}. They are not part of a series' identity:
  // counter("x", "", {}) is still the series that renders as x{rank="0",...}.
  void set_const_labels(const Labels& labels);

  std::string render_prometheus() const;

 private:
  struct Family {
    std::string help;
    MetricType type;
    std::vector<double> bounds;  // histograms
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  Family& family(const std::string& name, const std::string& help, MetricType type);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  Labels const_labels_;
};

// A sample value as Prometheus writes it: "+Inf", "-Inf", "NaN", or the
// shortest decimal that reads back to the same double.
std::string format_metric_value(double x);

}  // namespace tessera::obs

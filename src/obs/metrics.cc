#include "obs/metrics.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/check.h"

namespace tessera::obs {

namespace {

bool valid_name(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); i++) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Label values escape backslash, double quote and newline; HELP text escapes
// backslash and newline.
std::string escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quote) out += "\\\"";
    else out += c;
  }
  return out;
}

// {k="v",...} with an optional extra pair last (le for buckets); "" if empty.
std::string label_text(const Labels& labels, const char* extra_key = nullptr, const std::string& extra_value = "") {
  std::string s;
  for (const auto& [k, v] : labels.pairs()) s += fmt::format("{}{}=\"{}\"", s.empty() ? "" : ",", k, escape(v, true));
  if (extra_key) s += fmt::format("{}{}=\"{}\"", s.empty() ? "" : ",", extra_key, escape(extra_value, true));
  return s.empty() ? s : "{" + s + "}";
}

void atomic_add(std::atomic<double>& a, double x) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + x, std::memory_order_relaxed)) {
  }
}

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

}  // namespace

Labels::Labels(std::initializer_list<std::pair<std::string, std::string>> kv) {
  for (const auto& p : kv) {
    auto it = std::find_if(kv_.begin(), kv_.end(), [&](const auto& q) { return q.first == p.first; });
    if (it != kv_.end()) it->second = p.second;
    else kv_.push_back(p);
  }
  std::sort(kv_.begin(), kv_.end());
  for (const auto& [k, v] : kv_) CHECK(valid_name(k) && k != "le");
}

Labels Labels::merge(const Labels& base, const Labels& over) {
  Labels out = over;
  for (const auto& p : base.kv_) {
    auto it = std::lower_bound(out.kv_.begin(), out.kv_.end(), p.first,
                               [](const auto& q, const std::string& k) { return q.first < k; });
    if (it == out.kv_.end() || it->first != p.first) out.kv_.insert(it, p);
  }
  return out;
}

void Counter::add(double x) {
  CHECK(x >= 0.0);
  atomic_add(v_, x);
}

void Counter::advance_to(double total) {
  double cur = v_.load(std::memory_order_relaxed);
  while (cur < total && !v_.compare_exchange_weak(cur, total, std::memory_order_relaxed)) {
  }
}

void Gauge::add(double x) { atomic_add(v_, x); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 1; i < bounds_.size(); i++) CHECK(bounds_[i - 1] < bounds_[i]);
}

void Histogram::observe(double x) {
  // Bucket i counts bounds_[i-1] < x <= bounds_[i] (Prometheus' le).
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), x) - bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  counts_[i]++;
  sum_ += x;
  count_++;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {bounds_, counts_, sum_, count_};
}

std::vector<double> exponential_buckets(double start, double factor, int n) {
  CHECK(start > 0.0 && factor > 1.0 && n >= 1);
  std::vector<double> b;
  for (int i = 0; i < n; i++) b.push_back(start * std::pow(factor, i));
  return b;
}

std::string format_metric_value(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", x);  // shortest round-trip form
}

Registry::Family& Registry::family(const std::string& name, const std::string& help, MetricType type) {
  CHECK(valid_name(name));
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.help = help;
    it->second.type = type;
  }
  CHECK(it->second.type == type && "a metric name registered twice with different types");
  return it->second;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& series = family(name, help, MetricType::kCounter).counters[labels];
  if (!series) series = std::make_unique<Counter>();
  return *series;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& series = family(name, help, MetricType::kGauge).gauges[labels];
  if (!series) series = std::make_unique<Gauge>();
  return *series;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                               const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, help, MetricType::kHistogram);
  if (f.histograms.empty()) f.bounds = bounds;
  CHECK(f.bounds == bounds && "a histogram registered twice with different buckets");
  auto& series = f.histograms[labels];
  if (!series) series = std::make_unique<Histogram>(bounds);
  return *series;
}

void Registry::set_const_labels(const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  const_labels_ = labels;
}

std::string Registry::render_prometheus() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape(f.help, false), name, type_name(f.type));
    for (const auto& [own, c] : f.counters)
      out += fmt::format("{}{} {}\n", name, label_text(Labels::merge(const_labels_, own)),
                         format_metric_value(c->value()));
    for (const auto& [own, g] : f.gauges)
      out += fmt::format("{}{} {}\n", name, label_text(Labels::merge(const_labels_, own)),
                         format_metric_value(g->value()));
    for (const auto& [own, h] : f.histograms) {
      const Labels labels = Labels::merge(const_labels_, own);
      const Histogram::Snapshot s = h->snapshot();
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= s.bounds.size(); i++) {
        cumulative += s.counts[i];
        const std::string le = i < s.bounds.size() ? format_metric_value(s.bounds[i]) : "+Inf";
        out += fmt::format("{}_bucket{} {}\n", name, label_text(labels, "le", le), cumulative);
      }
      out += fmt::format("{}_sum{} {}\n", name, label_text(labels), format_metric_value(s.sum));
      out += fmt::format("{}_count{} {}\n", name, label_text(labels), s.count);
    }
  }
  return out;
}

}  // namespace tessera::obs

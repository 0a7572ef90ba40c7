// Reading the Prometheus text exposition format (version 0.0.4), the other
// side of Registry::render_prometheus (obs/metrics.h): what the dashboard
// scrapes from training ranks, `tessera serve` and `tessera route`; and
// histogram quantiles over the cumulative buckets it reads.
//
// The parser is forgiving: a line it cannot read (no value, an unclosed
// label set, a value that is not a number) is skipped and counted, never an
// error, so one odd series does not hide a target's others. Comments (# HELP,
// # TYPE) and blank lines are skipped and not counted. Timestamps after the
// value are ignored. Pure functions; any thread.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::obs {

// One sample: name{labels} value. Label values are unescaped (\\, \", \n).
struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;  // NaN, +Inf and -Inf as written ("NaN", "+Inf", "-Inf")
};

// The samples of `text` in order; `malformed`, when given, gets the number
// of lines skipped because they could not be read.
std::vector<PromSample> parse_prometheus_text(std::string_view text, int* malformed = nullptr);

// The q-quantile (0 <= q <= 1) of a histogram from its cumulative buckets,
// (upper bound `le`, count of observations <= le), in any order, +Inf
// included: Prometheus' histogram_quantile, linear within a bucket from the
// previous bound (0 for the first). A rank in the +Inf bucket answers the
// largest finite bound (0 when there is none). NaN without observations
// (no buckets, or a total count of 0); buckets with a NaN bound or count are
// ignored.
double bucket_quantile(std::vector<std::pair<double, double>> buckets, double q);

}  // namespace tessera::obs

#include "obs/prom_text.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace tessera::obs {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) i++;
  return i;
}

// A number at s[i...] (strtod: also NaN, +Inf, -Inf); false when there is none.
bool read_number(std::string_view s, size_t* i, double* out) {
  const std::string rest(s.substr(*i));
  char* end = nullptr;
  const double v = std::strtod(rest.c_str(), &end);
  if (end == rest.c_str()) return false;
  *out = v;
  *i += static_cast<size_t>(end - rest.c_str());
  return true;
}

// The label set of `line` from its '{' at *i; leaves *i after the '}'.
bool read_labels(std::string_view line, size_t* i, std::map<std::string, std::string>* labels) {
  size_t k = *i + 1;
  while (true) {
    k = skip_spaces(line, k);
    if (k >= line.size()) return false;
    if (line[k] == '}') break;
    const size_t eq = line.find('=', k);
    if (eq == std::string_view::npos) return false;
    std::string_view key = line.substr(k, eq - k);
    while (!key.empty() && is_space(key.back())) key.remove_suffix(1);
    if (key.empty()) return false;
    k = skip_spaces(line, eq + 1);
    if (k >= line.size() || line[k] != '"') return false;
    std::string value;
    for (k++;; k++) {
      if (k >= line.size()) return false;  // the quote never closes
      if (line[k] == '"') break;
      if (line[k] == '\\' && k + 1 < line.size()) {
        const char e = line[++k];
        value += e == 'n' ? '\n' : e;  // \\ and \" as themselves
        continue;
      }
      value += line[k];
    }
    (*labels)[std::string(key)] = std::move(value);
    k = skip_spaces(line, k + 1);
    if (k < line.size() && line[k] == ',') k++;
  }
  *i = k + 1;
  return true;
}

// One sample line; false when it cannot be read.
bool parse_line(std::string_view line, PromSample* s) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && !is_space(line[i])) i++;
  if (i == 0 || i == line.size()) return false;
  s->name = std::string(line.substr(0, i));
  if (line[i] == '{' && !read_labels(line, &i, &s->labels)) return false;
  i = skip_spaces(line, i);
  if (!read_number(line, &i, &s->value)) return false;
  // What may follow: a timestamp (milliseconds), which the dashboard ignores.
  i = skip_spaces(line, i);
  double timestamp = 0;
  if (i < line.size() && !read_number(line, &i, &timestamp)) return false;
  return skip_spaces(line, i) == line.size();
}

}  // namespace

std::vector<PromSample> parse_prometheus_text(std::string_view text, int* malformed) {
  std::vector<PromSample> out;
  int bad = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t first = skip_spaces(line, 0);
    if (first == line.size() || line[first] == '#') continue;
    PromSample s;
    if (parse_line(line.substr(first), &s)) {
      out.push_back(std::move(s));
    } else {
      bad++;
    }
  }
  if (malformed) *malformed = bad;
  return out;
}

double bucket_quantile(std::vector<std::pair<double, double>> buckets, double q) {
  // NaN would break the sort's ordering; such a bucket says nothing anyway.
  std::erase_if(buckets, [](const auto& b) { return std::isnan(b.first) || std::isnan(b.second); });
  std::sort(buckets.begin(), buckets.end());
  if (buckets.empty() || buckets.back().second <= 0) return std::nan("");
  const double rank = q * buckets.back().second;
  double lo = 0, below = 0;
  for (const auto& [le, count] : buckets) {
    if (count >= rank) {
      if (std::isinf(le)) return lo;
      return lo + (le - lo) * (count > below ? (rank - below) / (count - below) : 0);
    }
    lo = le;
    below = count;
  }
  return lo;
}

}  // namespace tessera::obs

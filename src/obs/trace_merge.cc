#include "obs/trace_merge.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <limits>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera::obs::trace {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct RankFile {
  int rank = 0;
  std::string path;
};

Result<std::vector<RankFile>> find_rank_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::NotFound(fmt::format("{}: no such folder (the --trace DIR of a training run)", dir));
  static const std::regex kName(R"(trace-rank-([0-9]+)\.json)");
  std::vector<RankFile> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kName)) continue;
    files.push_back(RankFile{std::stoi(m[1].str()), it->path().string()});
  }
  if (ec) return Status::IOError(fmt::format("{}: cannot list: {}", dir, ec.message()));
  if (files.empty())
    return Status::NotFound(fmt::format("{}: no trace-rank-*.json files (was the run started with --trace {}?)", dir,
                                        dir));
  std::sort(files.begin(), files.end(), [](const RankFile& a, const RankFile& b) { return a.rank < b.rank; });
  return files;
}

Result<json> read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return Status::Corruption(fmt::format("{}: not valid JSON (a run that was killed before writing it?)", path));
  return j;
}

}  // namespace

Result<MergeSummary> merge_trace_dir(const std::string& dir, const std::string& out_path) {
  ASSIGN_OR_RETURN(std::vector<RankFile> files, find_rank_files(dir));
  MergeSummary summary;
  json meta_events = json::array();
  json events = json::array();
  json ranks_meta = json::array();
  for (const RankFile& f : files) {
    ASSIGN_OR_RETURN(json j, read_json(f.path));
    auto bad = [&](const std::string& what) { return Status::Corruption(fmt::format("{}: {}", f.path, what)); };
    if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
      return bad("not a trace-event file (no traceEvents array)");
    const json* meta = nullptr;
    if (j.contains("otherData") && j["otherData"].is_object() && j["otherData"].contains("tessera"))
      meta = &j["otherData"]["tessera"];
    if (!meta || !meta->is_object() || !meta->contains("clock_offset_us") || !(*meta)["clock_offset_us"].is_number())
      return bad("no otherData.tessera.clock_offset_us (not written by tessera train --trace)");
    if (!meta->contains("rank") || !(*meta)["rank"].is_number_integer() || (*meta)["rank"].get<int>() != f.rank)
      return bad(fmt::format("otherData.tessera.rank does not say {}, as the file name does", f.rank));
    const double offset_us = (*meta)["clock_offset_us"].get<double>();
    if (meta->contains("clock_error_us") && (*meta)["clock_error_us"].is_number())
      summary.max_clock_error_us = std::max(summary.max_clock_error_us, (*meta)["clock_error_us"].get<double>());
    ranks_meta.push_back(*meta);
    summary.ranks.push_back(f.rank);
    for (json& e : j["traceEvents"]) {
      if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string())
        return bad("an event without a phase (\"ph\")");
      if (e["ph"] == "M") {
        meta_events.push_back(std::move(e));
        continue;
      }
      if (!e.contains("ts") || !e["ts"].is_number()) return bad("an event without a timestamp (\"ts\")");
      e["ts"] = e["ts"].get<double>() + offset_us;
      events.push_back(std::move(e));
    }
  }
  double t0 = std::numeric_limits<double>::infinity();
  for (const json& e : events) t0 = std::min(t0, e["ts"].get<double>());
  for (json& e : events) e["ts"] = std::round((e["ts"].get<double>() - t0) * 1000.0) / 1000.0;
  std::stable_sort(events.begin(), events.end(),
                   [](const json& a, const json& b) { return a["ts"].get<double>() < b["ts"].get<double>(); });

  json out = {{"displayTimeUnit", "ms"},
              {"otherData",
               {{"tessera",
                 {{"merged_from", dir},
                  {"clock", "rank 0's steady clock; 0 is the earliest event of any rank"},
                  {"max_clock_error_us", summary.max_clock_error_us},
                  {"ranks", ranks_meta}}}}}};
  json all = std::move(meta_events);
  for (json& e : events) all.push_back(std::move(e));
  summary.events = all.size();
  out["traceEvents"] = std::move(all);

  const std::string text = out.dump();
  const std::string tmp = out_path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::IOError(fmt::format("{}: cannot open for writing: {}", out_path, std::strerror(errno)));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    return Status::IOError(fmt::format("{}: cannot write: {}", out_path, std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0)
    return Status::IOError(fmt::format("{}: cannot write: {}", out_path, std::strerror(errno)));
  return summary;
}

}  // namespace tessera::obs::trace

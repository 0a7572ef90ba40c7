// The timeline tracer (obs/trace.h) and the merge of the ranks' files
// (obs/trace_merge.h).
#include "obs/trace.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "obs/trace_merge.h"

namespace tessera::obs::trace {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Every test starts and ends with the tracer off and empty.
class Trace : public ::testing::Test {
 protected:
  void SetUp() override {
    stop();
    reset();
  }
  void TearDown() override {
    stop();
    reset();
  }
};

size_t count_events() {
  size_t n = 0;
  for (const ThreadEvents& t : snapshot()) n += t.events.size();
  return n;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());  // throws (fails the test) when invalid
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST_F(Trace, OffRecordsNothing) {
  {
    Span s("forward layer", "compute", {{"layer", 1}});
    s.arg("bytes", 4);
    EXPECT_EQ(s.begin_ns(), -1);
  }
  complete("x", "c", 0, 1);
  async_begin("b", "c", 1, -1);
  async_end("b", "c", 1, -1);
  flow_start("f", "c", 1, -1);
  flow_end("f", "c", 1, -1);
  EXPECT_EQ(count_events(), 0u);
}

// Off, a span is a relaxed load and a branch: a few nanoseconds, against
// the ~40 spans of a step that takes tens of milliseconds or more.
TEST_F(Trace, OffSpanCostsNanoseconds) {
  constexpr int kSpans = 10'000'000;
  const int64_t t0 = now_ns();
  for (int i = 0; i < kSpans; i++) {
    Span s("forward layer", "compute", {{"layer", i}});
    asm volatile("" ::: "memory");  // keep the loop
  }
  const double ns_per_span = static_cast<double>(now_ns() - t0) / kSpans;
  std::printf("a span with tracing off: %.2f ns\n", ns_per_span);
  EXPECT_LT(ns_per_span, 100.0);  // generous: a loaded machine
  EXPECT_EQ(count_events(), 0u);
}

// On, a span is two clock reads and an append: well under a microsecond
// (docs/performance.md turns this into a share of a step).
TEST_F(Trace, OnSpanCostsUnderAMicrosecond) {
  constexpr int kSpans = 200'000;
  start();
  const int64_t t0 = now_ns();
  for (int i = 0; i < kSpans; i++) Span s("forward layer", "compute", {{"layer", i}});
  const double ns_per_span = static_cast<double>(now_ns() - t0) / kSpans;
  stop();
  std::printf("a span with tracing on: %.1f ns\n", ns_per_span);
  EXPECT_LT(ns_per_span, 5000.0);  // generous: a loaded machine
  EXPECT_EQ(count_events(), static_cast<size_t>(kSpans));
}

TEST_F(Trace, SpansNestAndCarryTheStepAndArgs) {
  start();
  set_step(7);
  {
    Span outer("backward", "compute", {{"micro", 2}});
    Span inner("backward layer", "compute", {{"layer", 3}});
    inner.arg("bytes", 1024);
  }
  stop();
  std::vector<Event> events;
  for (const ThreadEvents& t : snapshot()) events.insert(events.end(), t.events.begin(), t.events.end());
  ASSERT_EQ(events.size(), 2u);
  const Event& inner = events[0];  // recorded when it ends, first
  const Event& outer = events[1];
  EXPECT_STREQ(inner.name, "backward layer");
  EXPECT_STREQ(outer.name, "backward");
  EXPECT_EQ(inner.ph, 'X');
  EXPECT_GE(inner.ts_ns, outer.ts_ns);
  EXPECT_LE(inner.ts_ns + inner.dur_ns, outer.ts_ns + outer.dur_ns);
  EXPECT_EQ(inner.step, 7);
  ASSERT_EQ(inner.nargs, 2);
  EXPECT_STREQ(inner.args[0].key, "layer");
  EXPECT_EQ(inner.args[0].value, 3);
  EXPECT_STREQ(inner.args[1].key, "bytes");
  EXPECT_EQ(inner.args[1].value, 1024);
}

TEST_F(Trace, ExtraArgsAreIgnored) {
  start();
  { Span s("s", "c", {{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}, {"e", 5}}); }
  stop();
  const std::vector<ThreadEvents> t = snapshot();
  size_t found = 0;
  for (const ThreadEvents& te : t)
    for (const Event& e : te.events) {
      EXPECT_EQ(e.nargs, kMaxArgs);
      found++;
    }
  EXPECT_EQ(found, 1u);
}

TEST_F(Trace, WritesValidTraceEventJsonWithNamedProcessAndThreads) {
  start();
  set_step(3);
  { Span s("optimizer", "optim"); }
  async_begin("allreduce bucket", "comm", 0xabc, -1, {{"bucket", 0}});
  async_end("allreduce bucket", "comm", 0xabc, -1);
  flow_start("p2p", "pipeline", 42, -1);
  flow_end("p2p", "pipeline", 42, -1);
  std::thread([] {
    set_thread_name("checkpoint writer \"w\"");  // quotes are escaped
    Span s("checkpoint write", "checkpoint");
  }).join();
  stop();
  const std::string dir = fresh_dir("trace_write");
  size_t n = 0;
  ASSERT_TRUE(write_json(dir + "/trace-rank-3.json",
                         ProcessInfo{3, "rank 3 (dp1 tp0 pp1) host", R"({"rank":3,"clock_offset_us":1.5})"}, &n)
                  .ok());
  EXPECT_EQ(n, 6u);
  json j = read_json_file(dir + "/trace-rank-3.json");
  EXPECT_EQ(j["otherData"]["tessera"]["rank"], 3);
  EXPECT_EQ(j["otherData"]["dropped_events"], 0);
  std::map<std::string, int> by_ph;
  std::set<std::string> thread_names;
  std::set<int> tids;
  for (const json& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    by_ph[e["ph"].get<std::string>()]++;
    if (e["name"] == "process_name") EXPECT_EQ(e["args"]["name"], "rank 3 (dp1 tp0 pp1) host");
    if (e["name"] == "thread_name") thread_names.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] == "X") {
      EXPECT_TRUE(e["dur"].is_number());
      EXPECT_TRUE(e["ts"].is_number());
      tids.insert(e["tid"].get<int>());
    }
    if (e["name"] == "optimizer") EXPECT_EQ(e["args"]["step"], 3);
    if (e["ph"] == "f") EXPECT_EQ(e["bp"], "e");
    if (e["ph"] == "b" || e["ph"] == "e") EXPECT_EQ(e["id"], "0xabc");
  }
  EXPECT_EQ(by_ph["X"], 2);
  EXPECT_EQ(by_ph["b"], 1);
  EXPECT_EQ(by_ph["e"], 1);
  EXPECT_EQ(by_ph["s"], 1);
  EXPECT_EQ(by_ph["f"], 1);
  EXPECT_EQ(tids.size(), 2u);  // the writer thread has its own
  EXPECT_TRUE(thread_names.count("checkpoint writer \"w\""));
}

TEST_F(Trace, WriteToAMissingFolderIsAnIOErrorNamingIt) {
  Status st = write_json("/nonexistent-tessera/trace-rank-0.json", ProcessInfo{});
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find("/nonexistent-tessera/"), std::string::npos);
}

// A rank file as the trainer writes it, by hand: events at local times.
void write_rank(const std::string& dir, int rank, double offset_us, const std::vector<json>& events) {
  json j = {{"traceEvents", events},
            {"otherData", {{"tessera", {{"rank", rank}, {"clock_offset_us", offset_us}, {"clock_error_us", 2.0}}}}}};
  j["traceEvents"].push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 0},
                              {"args", {{"name", "rank"}}}});
  std::ofstream(dir + "/trace-rank-" + std::to_string(rank) + ".json") << j.dump();
}

TEST_F(Trace, MergeAppliesTheOffsetsAndOrdersByTime) {
  const std::string dir = fresh_dir("trace_merge");
  // Rank 1's clock is 1000 us behind rank 0's: its send at local 500 is at
  // 1500 on rank 0's clock, before rank 0's receive ending at 1600.
  write_rank(dir, 0, 0.0, {{{"name", "recv act"}, {"ph", "X"}, {"pid", 0}, {"tid", 1}, {"ts", 1400.0}, {"dur", 200.0}}});
  write_rank(dir, 1, 1000.0, {{{"name", "send act"}, {"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", 500.0}, {"dur", 5.0}}});
  Result<MergeSummary> r = merge_trace_dir(dir, dir + "/merged.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->ranks, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(r->max_clock_error_us, 2.0);
  json j = read_json_file(dir + "/merged.json");
  std::vector<json> timed;
  for (const json& e : j["traceEvents"])
    if (e["ph"] != "M") timed.push_back(e);
  ASSERT_EQ(timed.size(), 2u);
  EXPECT_EQ(timed[0]["name"], "recv act");  // 1400 on rank 0's clock, now 0
  EXPECT_DOUBLE_EQ(timed[0]["ts"].get<double>(), 0.0);
  EXPECT_EQ(timed[1]["name"], "send act");
  EXPECT_DOUBLE_EQ(timed[1]["ts"].get<double>(), 100.0);
  EXPECT_EQ(j["otherData"]["tessera"]["ranks"].size(), 2u);
}

TEST_F(Trace, MergeOfAMissingFolderIsNotFound) {
  Result<MergeSummary> r = merge_trace_dir("/nonexistent-tessera-trace", "/tmp/x.json");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent-tessera-trace"), std::string::npos);
}

TEST_F(Trace, MergeOfAFolderWithoutTracesIsNotFound) {
  const std::string dir = fresh_dir("trace_merge_empty");
  Result<MergeSummary> r = merge_trace_dir(dir, dir + "/merged.json");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("no trace-rank-*.json"), std::string::npos);
}

TEST_F(Trace, MergeOfATruncatedFileIsCorruptionNamingIt) {
  const std::string dir = fresh_dir("trace_merge_truncated");
  write_rank(dir, 0, 0.0, {});
  std::ofstream(dir + "/trace-rank-1.json") << R"({"traceEvents":[{"ph":"X","ts":)";
  Result<MergeSummary> r = merge_trace_dir(dir, dir + "/merged.json");
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("trace-rank-1.json"), std::string::npos);
}

TEST_F(Trace, MergeOfAFileWithoutAClockOffsetIsCorruption) {
  const std::string dir = fresh_dir("trace_merge_no_offset");
  std::ofstream(dir + "/trace-rank-0.json") << R"({"traceEvents":[]})";
  Result<MergeSummary> r = merge_trace_dir(dir, dir + "/merged.json");
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("clock_offset_us"), std::string::npos);
}

TEST_F(Trace, MergeOfAFileWhoseRankDisagreesWithItsNameIsCorruption) {
  const std::string dir = fresh_dir("trace_merge_wrong_rank");
  write_rank(dir, 0, 0.0, {});
  fs::rename(dir + "/trace-rank-0.json", dir + "/trace-rank-2.json");
  Result<MergeSummary> r = merge_trace_dir(dir, dir + "/merged.json");
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("trace-rank-2.json"), std::string::npos);
}

}  // namespace
}  // namespace tessera::obs::trace

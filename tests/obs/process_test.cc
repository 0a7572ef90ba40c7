// The process_* figures from /proc/self, and their Prometheus names.
#include "obs/process.h"

#include <chrono>
#include <ctime>
#include <vector>

#include <gtest/gtest.h>

namespace tessera::obs {
namespace {

TEST(Process, ReadsCpuMemoryStartTimeAndFds) {
  // Some CPU time and some resident memory of our own.
  std::vector<char> touched(64 << 20, 1);
  volatile double x = 0;
  for (auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50);)
    x = x + 1;
  Result<ProcessStats> s = read_process_stats();
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_GT(s->cpu_seconds, 0.0);
  EXPECT_GE(s->resident_bytes, 64.0 * (1 << 20));
  EXPECT_GE(s->virtual_bytes, s->resident_bytes);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(s->start_time_seconds, now - 24 * 3600.0);
  EXPECT_LE(s->start_time_seconds, now + 1);
  EXPECT_GE(s->open_fds, 3);  // stdin, stdout, stderr
  EXPECT_EQ(touched[12345], 1);
}

TEST(Process, RecordsTheStandardNamesAndCpuOnlyGrows) {
  // The CPU counter comes from /proc/self/stat in clock ticks (10 ms): a
  // test process that has just started (ctest runs each test in its own)
  // may not have used one yet. 50 ms of CPU first (std::clock advances with
  // this process's CPU time, so the loop ends).
  const std::clock_t start = std::clock();
  volatile double sink = 0.0;
  while (std::clock() - start < CLOCKS_PER_SEC / 20) sink = sink + 1.0;
  Registry r;
  update_process_metrics(r);
  const double cpu = r.counter("process_cpu_seconds_total", "").value();
  EXPECT_GT(cpu, 0.0);
  update_process_metrics(r);
  EXPECT_GE(r.counter("process_cpu_seconds_total", "").value(), cpu);
  const std::string text = r.render_prometheus();
  for (const char* line : {"# TYPE process_cpu_seconds_total counter\n", "# TYPE process_resident_memory_bytes gauge\n",
                           "# TYPE process_virtual_memory_bytes gauge\n", "# TYPE process_start_time_seconds gauge\n",
                           "# TYPE process_open_fds gauge\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
}

}  // namespace
}  // namespace tessera::obs

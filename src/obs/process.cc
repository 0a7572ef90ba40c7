#include "obs/process.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

namespace tessera::obs {

namespace {

Result<std::string> read_text(const char* path) {
  std::ifstream in(path);
  if (!in) return Status::IOError(fmt::format("{}: cannot open", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Seconds since the epoch at which the machine booted ("btime" in
// /proc/stat); 0 when unknown. It does not change while we run.
double boot_time_seconds() {
  static const double btime = [] {
    std::ifstream in("/proc/stat");
    std::string key;
    double v = 0;
    while (in >> key) {
      if (key == "btime") {
        in >> v;
        return v;
      }
      in.ignore(1 << 20, '\n');
    }
    return 0.0;
  }();
  return btime;
}

}  // namespace

Result<ProcessStats> read_process_stats() {
  ProcessStats s;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));

  // /proc/self/stat: "pid (comm) state ppid ...": comm may hold spaces and
  // parentheses, so the fields are counted from the last ')'. Field numbers
  // (proc(5)): 14 utime, 15 stime (clock ticks), 22 starttime (ticks after
  // boot), 23 vsize (bytes).
  ASSIGN_OR_RETURN(std::string stat, read_text("/proc/self/stat"));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return Status::IOError("/proc/self/stat: no ')' after the command name");
  std::istringstream fields(stat.substr(close + 1));
  std::string f;
  double utime = 0, stime = 0, starttime = 0, vsize = 0;
  for (int n = 3; n <= 23 && fields >> f; n++) {
    if (n == 14) utime = std::stod(f);
    if (n == 15) stime = std::stod(f);
    if (n == 22) starttime = std::stod(f);
    if (n == 23) vsize = std::stod(f);
  }
  if (!fields) return Status::IOError("/proc/self/stat: fewer than 23 fields");
  s.cpu_seconds = (utime + stime) / ticks;
  s.virtual_bytes = vsize;
  if (const double btime = boot_time_seconds(); btime > 0) s.start_time_seconds = btime + starttime / ticks;

  // /proc/self/statm: size resident shared ... (pages).
  ASSIGN_OR_RETURN(std::string statm, read_text("/proc/self/statm"));
  double size_pages = 0, resident_pages = 0;
  if (std::sscanf(statm.c_str(), "%lf %lf", &size_pages, &resident_pages) != 2)
    return Status::IOError("/proc/self/statm: cannot parse");
  s.resident_bytes = resident_pages * page;
  // /proc/self/status: "VmHWM:    123456 kB", the peak resident set.
  if (Result<std::string> status = read_text("/proc/self/status"); status.ok()) {
    const size_t at = status->find("VmHWM:");
    double kb = 0;
    if (at != std::string::npos && std::sscanf(status->c_str() + at + 6, "%lf", &kb) == 1)
      s.peak_resident_bytes = kb * 1024;
  }

  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    s.open_fds += 1;
  return s;
}

void update_process_metrics(Registry& registry) {
  Result<ProcessStats> s = read_process_stats();
  if (!s.ok()) return;
  registry.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds")
      .advance_to(s->cpu_seconds);
  registry.gauge("process_resident_memory_bytes", "Resident memory size in bytes").set(s->resident_bytes);
  registry.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes").set(s->virtual_bytes);
  if (s->start_time_seconds > 0)
    registry.gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds")
        .set(s->start_time_seconds);
  registry.gauge("process_open_fds", "Number of open file descriptors").set(s->open_fds);
}

namespace {

// The first number in a file ("max" and unreadable files: 0).
double read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stod(word);
}

}  // namespace

MemoryLimit host_memory_limit() {
  MemoryLimit limit;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit) {
    if (key == "MemTotal:") {
      limit.bytes = kb * 1024;
      limit.source = "physical memory";
      break;
    }
  }
  double cgroup = read_number("/sys/fs/cgroup/memory.max");                                  // v2
  if (cgroup == 0) cgroup = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");  // v1
  if (cgroup > 0 && (limit.bytes == 0 || cgroup < limit.bytes)) {
    limit.bytes = cgroup;
    limit.source = "the cgroup's memory limit";
  }
  return limit;
}

}  // namespace tessera::obs

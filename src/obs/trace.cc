#include "obs/trace.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>

#include <fmt/format.h>

namespace tessera::obs::trace {

namespace internal {
std::atomic<bool> g_enabled{false};
}  // namespace internal

namespace {

// One thread's events. The owning thread appends under mu (uncontended but
// for snapshot()); a deque, so growing never copies what is recorded.
struct ThreadBuffer {
  int tid = 0;
  std::string name;
  std::mutex mu;
  std::deque<Event> events;
  uint64_t dropped = 0;
};

// Every thread's buffer, kept for the life of the process (a thread that
// ended, such as a checkpoint writer, leaves its events to be written).
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadBuffer>> threads;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may record during exit
  return *r;
}

std::atomic<int64_t> g_step{-1};

ThreadBuffer& this_thread_buffer() {
  thread_local ThreadBuffer* buf = nullptr;
  if (!buf) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.threads.push_back(std::make_unique<ThreadBuffer>());
    buf = r.threads.back().get();
    buf->tid = static_cast<int>(r.threads.size());
    buf->name = fmt::format("thread {}", buf->tid);
  }
  return *buf;
}

void record(const Event& e) {
  ThreadBuffer& b = this_thread_buffer();
  std::lock_guard lock(b.mu);
  if (b.events.size() >= kMaxEventsPerThread) {
    b.dropped++;
    return;
  }
  b.events.push_back(e);
}

Event make(const char* name, const char* cat, char ph, int64_t ts_ns, std::initializer_list<Arg> args) {
  Event e;
  e.name = name;
  e.cat = cat;
  e.ph = ph;
  e.ts_ns = ts_ns < 0 ? now_ns() : ts_ns;
  e.step = g_step.load(std::memory_order_relaxed);
  for (const Arg& a : args) {
    if (e.nargs == kMaxArgs) break;
    e.args[e.nargs++] = a;
  }
  return e;
}

// JSON string contents: quotes, backslashes and control characters escaped.
void append_escaped(fmt::memory_buffer& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        else out.push_back(c);
    }
  }
}

void append_us(fmt::memory_buffer& out, int64_t ns) {
  // Microseconds with three decimals: exact, and no exponent.
  const char* sign = ns < 0 ? "-" : "";
  const uint64_t a = ns < 0 ? static_cast<uint64_t>(-ns) : static_cast<uint64_t>(ns);
  fmt::format_to(std::back_inserter(out), "{}{}.{:03d}", sign, a / 1000, a % 1000);
}

void append_event(fmt::memory_buffer& out, const Event& e, int pid, int tid) {
  out.append(std::string_view("{\"name\":\""));
  append_escaped(out, e.name);
  out.append(std::string_view("\",\"cat\":\""));
  append_escaped(out, e.cat);
  fmt::format_to(std::back_inserter(out), "\",\"ph\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":", e.ph, pid, tid);
  append_us(out, e.ts_ns);
  if (e.ph == 'X') {
    out.append(std::string_view(",\"dur\":"));
    append_us(out, e.dur_ns);
  }
  if (e.ph == 'b' || e.ph == 'e' || e.ph == 's' || e.ph == 'f')
    fmt::format_to(std::back_inserter(out), ",\"id\":\"0x{:x}\"", e.id);
  if (e.ph == 'f') out.append(std::string_view(",\"bp\":\"e\""));
  if (e.ph != 's' && e.ph != 'f') {
    out.append(std::string_view(",\"args\":{"));
    bool first = true;
    if (e.step >= 0) {
      fmt::format_to(std::back_inserter(out), "\"step\":{}", e.step);
      first = false;
    }
    for (int i = 0; i < e.nargs; i++) {
      out.append(std::string_view(first ? "\"" : ",\""));
      append_escaped(out, e.args[i].key);
      fmt::format_to(std::back_inserter(out), "\":{}", e.args[i].value);
      first = false;
    }
    out.push_back('}');
  }
  out.push_back('}');
}

void append_metadata(fmt::memory_buffer& out, const char* what, int pid, int tid, const char* key,
                     const std::string& value, bool quote) {
  fmt::format_to(std::back_inserter(out), "{{\"name\":\"{}\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"{}\":",
                 what, pid, tid, key);
  if (quote) {
    out.push_back('"');
    append_escaped(out, value);
    out.push_back('"');
  } else {
    out.append(value);
  }
  out.append(std::string_view("}}"));
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void start() { internal::g_enabled.store(true, std::memory_order_relaxed); }
void stop() { internal::g_enabled.store(false, std::memory_order_relaxed); }

void reset() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (auto& t : r.threads) {
    std::lock_guard tl(t->mu);
    t->events.clear();
    t->dropped = 0;
  }
  g_step.store(-1, std::memory_order_relaxed);
}

void set_step(int64_t step) { g_step.store(step, std::memory_order_relaxed); }
int64_t current_step() { return g_step.load(std::memory_order_relaxed); }

void set_thread_name(const std::string& name) {
  ThreadBuffer& b = this_thread_buffer();
  std::lock_guard lock(b.mu);
  b.name = name;
}

void Span::begin(const char* name, const char* cat, std::initializer_list<Arg> args) {
  ev_ = make(name, cat, 'X', -1, args);
}

void Span::end() {
  ev_.dur_ns = now_ns() - ev_.ts_ns;
  record(ev_);
}

void complete(const char* name, const char* cat, int64_t begin_ns, int64_t end_ns, std::initializer_list<Arg> args) {
  if (!enabled()) return;
  Event e = make(name, cat, 'X', begin_ns, args);
  e.dur_ns = (end_ns < 0 ? now_ns() : end_ns) - e.ts_ns;
  record(e);
}

void async_begin(const char* name, const char* cat, uint64_t id, int64_t ts_ns, std::initializer_list<Arg> args) {
  if (!enabled()) return;
  Event e = make(name, cat, 'b', ts_ns, args);
  e.id = id;
  record(e);
}

void async_end(const char* name, const char* cat, uint64_t id, int64_t ts_ns) {
  if (!enabled()) return;
  Event e = make(name, cat, 'e', ts_ns, {});
  e.id = id;
  record(e);
}

void flow_start(const char* name, const char* cat, uint64_t id, int64_t ts_ns) {
  if (!enabled()) return;
  Event e = make(name, cat, 's', ts_ns, {});
  e.id = id;
  record(e);
}

void flow_end(const char* name, const char* cat, uint64_t id, int64_t ts_ns) {
  if (!enabled()) return;
  Event e = make(name, cat, 'f', ts_ns, {});
  e.id = id;
  record(e);
}

std::vector<ThreadEvents> snapshot() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<ThreadEvents> out;
  for (auto& t : r.threads) {
    std::lock_guard tl(t->mu);
    ThreadEvents te;
    te.tid = t->tid;
    te.name = t->name;
    te.events.assign(t->events.begin(), t->events.end());
    te.dropped = t->dropped;
    out.push_back(std::move(te));
  }
  return out;
}

Status write_json(const std::string& path, const ProcessInfo& info, size_t* events, uint64_t* dropped) {
  const std::vector<ThreadEvents> threads = snapshot();
  uint64_t dropped_events = 0;
  for (const ThreadEvents& t : threads) dropped_events += t.dropped;
  fmt::memory_buffer out;
  out.append(std::string_view("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"tessera\":"));
  out.append(info.metadata_json.empty() ? std::string_view("{}") : std::string_view(info.metadata_json));
  fmt::format_to(std::back_inserter(out), ",\"dropped_events\":{}}},\"traceEvents\":[\n", dropped_events);
  append_metadata(out, "process_name", info.pid, 0, "name", info.process_name, true);
  out.append(std::string_view(",\n"));
  append_metadata(out, "process_sort_index", info.pid, 0, "sort_index", std::to_string(info.pid), false);
  size_t n = 0;
  for (const ThreadEvents& t : threads) {
    if (t.events.empty()) continue;
    out.append(std::string_view(",\n"));
    append_metadata(out, "thread_name", info.pid, t.tid, "name", t.name, true);
    for (const Event& e : t.events) {
      out.append(std::string_view(",\n"));
      append_event(out, e, info.pid, t.tid);
      n++;
    }
  }
  out.append(std::string_view("\n]}\n"));

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::IOError(fmt::format("{}: cannot open for writing: {}", tmp, std::strerror(errno)));
  const bool wrote = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    return Status::IOError(fmt::format("{}: cannot write: {}", tmp, std::strerror(wrote ? errno : err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::IOError(fmt::format("{}: cannot rename to {}: {}", tmp, path, std::strerror(errno)));
  if (events) *events = n;
  if (dropped) *dropped = dropped_events;
  return Status::OK();
}

uint64_t mix_id(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace tessera::obs::trace

// The timeline tracer behind `tessera train --trace DIR`: spans of work
// (forward and backward per layer, bucket all-reduces, pipeline sends and
// receives, the optimizer, checkpoints, evaluation) recorded per thread and
// written as Chrome trace-event JSON (the "JSON Object Format" that Perfetto
// and chrome://tracing open). docs/monitoring.md, "Timeline trace", lists
// the span names; `tessera trace merge` (obs/trace_merge.h) puts the ranks'
// files on one clock.
//
// One tracer per process (a rank), global: code anywhere records with
//
//   obs::trace::Span span("forward layer", "compute", {{"layer", l}});
//
// and the span's duration is recorded when it goes out of scope. Off (the
// default), a Span costs one relaxed atomic load and a branch; nothing is
// allocated or stored. Names and categories must be string literals (or
// otherwise outlive the tracer): only the pointer is kept.
//
// Timestamps are the steady clock (CLOCK_MONOTONIC on Linux) in
// nanoseconds, written in microseconds; each rank's file carries, in its
// metadata, the offset of its clock to rank 0's (train/tracing.h measures
// it), which the merge applies.
//
// Thread safety: recording may happen on any thread, concurrently; each
// thread appends to its own buffer (a mutex that only the writer of the
// file ever contends). start(), stop(), reset() and write_json() are called
// by the owner (the trainer's TraceSession, a test), not while another
// thread calls them.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::obs::trace {

namespace internal {
extern std::atomic<bool> g_enabled;
}  // namespace internal

// Whether spans are being recorded: one relaxed load.
inline bool enabled() { return internal::g_enabled.load(std::memory_order_relaxed); }

// The steady clock in nanoseconds.
int64_t now_ns();

struct Arg {
  const char* key;  // a literal
  int64_t value;
};
constexpr int kMaxArgs = 4;

// One recorded event. ph is the trace-event phase: 'X' complete (ts, dur),
// 'b'/'e' async begin/end (id), 's'/'f' flow start/end (id), 'i' instant.
struct Event {
  const char* name = "";
  const char* cat = "";
  char ph = 'X';
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
  uint64_t id = 0;
  int64_t step = -1;  // the training step when recorded (set_step); -1: none
  int nargs = 0;
  Arg args[kMaxArgs] = {};
};

// Most events kept per thread; later ones are dropped and counted.
constexpr size_t kMaxEventsPerThread = size_t{1} << 21;

// Turns recording on (and off). Events recorded earlier stay until reset().
void start();
void stop();
// Drops every recorded event and the step (tests; a new session).
void reset();

// The step that every event recorded from now on carries ("step" in args);
// -1 for none.
void set_step(int64_t step);
int64_t current_step();
// Names the calling thread in the trace ("training", "checkpoint writer").
// Costs a lookup; call once per thread.
void set_thread_name(const std::string& name);

// A complete event ('X') from construction to destruction, with up to
// kMaxArgs integer args (more are ignored). arg() adds one later.
class Span {
 public:
  Span(const char* name, const char* cat, std::initializer_list<Arg> args = {}) {
    if (!enabled()) return;
    begin(name, cat, args);
  }
  ~Span() {
    if (ev_.ts_ns >= 0) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  void arg(const char* key, int64_t value) {
    if (ev_.ts_ns >= 0 && ev_.nargs < kMaxArgs) ev_.args[ev_.nargs++] = Arg{key, value};
  }
  // The span's start (steady clock, ns); -1 when tracing was off.
  int64_t begin_ns() const { return ev_.ts_ns; }

 private:
  void begin(const char* name, const char* cat, std::initializer_list<Arg> args);
  void end();
  Event ev_{.ts_ns = -1};
};

// The other phases; no-ops when off. ts_ns < 0 means now.
void complete(const char* name, const char* cat, int64_t begin_ns, int64_t end_ns, std::initializer_list<Arg> args = {});
void async_begin(const char* name, const char* cat, uint64_t id, int64_t ts_ns, std::initializer_list<Arg> args = {});
void async_end(const char* name, const char* cat, uint64_t id, int64_t ts_ns);
void flow_start(const char* name, const char* cat, uint64_t id, int64_t ts_ns);
void flow_end(const char* name, const char* cat, uint64_t id, int64_t ts_ns);

// Every thread's events, in recording order per thread, with their trace
// thread ids (1, 2, ... in order of first use) and names.
struct ThreadEvents {
  int tid = 0;
  std::string name;
  std::vector<Event> events;
  uint64_t dropped = 0;
};
std::vector<ThreadEvents> snapshot();

// What write_json() puts in the file besides the events.
struct ProcessInfo {
  int pid = 0;                 // the rank
  std::string process_name;    // "rank 0 (dp0 tp0 pp0) host"
  std::string metadata_json;   // a JSON object for otherData.tessera ("{}" when empty)
};
// Writes the trace-event JSON of snapshot() to `path` (path.tmp, then a
// rename): {"traceEvents": [...], "displayTimeUnit": "ms", "otherData":
// {"tessera": metadata, "dropped_events": N}}; process_name/thread_name
// metadata events name the rank and its threads. IOError naming the path
// when it cannot be written. *events and *dropped (if given) get the number
// of events written and of events dropped (kMaxEventsPerThread).
Status write_json(const std::string& path, const ProcessInfo& info, size_t* events = nullptr,
                  uint64_t* dropped = nullptr);

// A 64-bit mix for flow and async ids (splitmix64's finaliser).
uint64_t mix_id(uint64_t x);

}  // namespace tessera::obs::trace

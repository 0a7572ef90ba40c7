// The router's workers and its retry policy, apart from its HTTP front end
// (router.h describes the behaviour a client sees).
//
// WorkerPool: the workers of every tier, their health (up, out, recovering
// under a hold-down that doubles with each strike), their load (requests in
// flight), the active tier, and the one way a request is sent to a worker
// (send(), which a take-out aborts from another thread).
//
// RetryPolicy: one request's attempts. next() picks the worker (the first
// tier with one up, the fewest in flight, none already full), judge() says
// what an attempt's outcome means and does it to the worker:
//   - an answer (200): deliver it; the worker's strikes are cleared;
//   - a 429: that worker is full for this request; try another; if all are,
//     the client gets the 429;
//   - a 5xx, a refused connection, a cut or silent stream, a stream that
//     ended with an error or without [DONE]: take the worker out, retry;
//   - aborted (taken out meanwhile by another request or its health check):
//     retry;
//   - any other status (4xx): the client's error, passed through.
// give_up() is the answer when the attempts run out.
//
// Thread safety: WorkerPool is shared by every request thread and the health
// threads (one mutex); a RetryPolicy belongs to one request.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "obs/metrics.h"
#include "serve/openai.h"

namespace httplib {
class Client;
}

namespace tessera::serve {

struct RouteTier {
  std::string name;               // gpu, cpu, ...
  std::vector<std::string> urls;  // http://HOST:PORT or https://HOST:PORT
};

}  // namespace tessera::serve

namespace tessera::serve::route {

using Clock = std::chrono::steady_clock;

struct Address {
  std::string host;
  int port = 0;
  bool tls = false;  // https://
};

// "http://HOST:PORT" or "https://HOST:PORT"; InvalidArgument naming what is wrong.
Result<Address> parse_url(const std::string& url);

struct PoolOptions {
  double health_timeout_s = 1.0;
  int health_failures = 2;          // deadlines missed in a row that take a worker out
  double hold_down_s = 5.0;         // healthy this long before a worker is back
  double connect_timeout_s = 1.0;
  double stall_timeout_s = 60.0;    // a worker silent this long fails the attempt
  double wait_for_worker_s = 10.0;  // with no worker up, pick() waits this long
  std::string worker_api_key;       // sent to the workers
  std::string worker_ca, worker_cert, worker_key;  // https:// workers
};

// One request sent to one worker; abort() from another thread ends it.
struct Attempt {
  std::unique_ptr<httplib::Client> cli;
  std::atomic<bool> aborted{false};
  void abort();
};

struct Worker {
  std::string url;
  Address addr;
  size_t tier = 0;
  std::string tier_name;
  obs::Gauge* up_gauge = nullptr;
  // Under WorkerPool's mutex.
  bool up = false;
  bool ever_up = false;
  std::string reason = "not checked yet";
  int missed = 0;   // health deadlines missed in a row
  int strikes = 0;  // taken out since its last request answered (circuit breaker)
  std::optional<Clock::time_point> passing_since;
  int inflight = 0;
  std::set<Attempt*> attempts;
  std::string served_model;
};

// How an attempt at a worker ended.
struct Outcome {
  enum Kind { kAnswered, kFailed, kAborted } kind = kFailed;
  int status = 0;
  std::string body;    // an answer's body (non-streamed, or an error)
  std::string reason;  // kFailed: why, for the log and /health
  std::string label;   // kFailed: the failover reason label
};

// The label and reason a worker is taken out for, from its error answer
// (a 5xx, or a stream's error event): "device_error" when its message says
// so, else "http_5xx".
std::pair<std::string, std::string> failure_of(int status, const std::string& body);

// A worker's state for /health.
struct WorkerView {
  std::string url, tier, reason, model;
  size_t tier_index = 0;
  bool up = false;
  int inflight = 0;
};

class WorkerPool {
 public:
  WorkerPool(const std::vector<RouteTier>& tiers, const PoolOptions& opts, obs::Registry& registry);
  ~WorkerPool();  // stops and joins the health threads
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  const std::vector<std::unique_ptr<Worker>>& workers() const { return workers_; }
  const std::vector<std::string>& tier_names() const { return tier_names_; }

  // Asks every worker's /health once, then every interval_s on a thread per
  // worker until stop().
  void start_health(double interval_s);
  // Ends the health threads, wakes pick()'s waiters and aborts every attempt
  // in flight. Idempotent.
  void stop();

  // The worker for an attempt: in the first tier with a worker up that is
  // not in `skip`, the one with the fewest in flight (its count is raised;
  // send() lowers it). Waits up to wait_for_worker_s while none is up;
  // nullptr then, at once when every worker up is in `skip`, and after stop().
  Worker* pick(const std::set<Worker*>& skip);
  // Gives back a pick() that will not be sent.
  void unpick(Worker& w);
  // Sends body to w's path. With on_data, a 200 answer's body goes to it as
  // it arrives (return false to stop); otherwise it is collected.
  Outcome send(Worker& w, const std::string& path, const std::string& body,
               const std::function<bool(const char*, size_t)>& on_data);

  // Takes w out (if up) and aborts its requests in flight.
  void take_out(Worker& w, const std::string& label, const std::string& reason);
  // A /health answered 200: w is up at once the first time, and after a
  // take-out once it has passed for hold_down_s x 2^(strikes-1) (at most 32x).
  void health_passed(Worker& w, const std::string& model, Clock::time_point now = Clock::now());
  // A /health deadline missed: w is taken out after health_failures in a row.
  void health_missed(Worker& w);
  // One GET /health of w, and what it means.
  void check(Worker& w);
  // A request answered: the circuit breaker's count starts again.
  void succeeded(Worker& w);

  std::string served_model(Worker& w);
  // The first worker's model that answered /health ("" when none did).
  std::string any_served_model();
  int active_tier();  // -1: none up
  std::string active_reason();
  std::vector<WorkerView> view();
  // Counts an attempt after the first (tessera_route_retries_total).
  void count_retry() { retries_->add(1); }

 private:
  void update_active_locked(const std::string& label, const std::string& why);
  void health_loop(Worker& w, double interval_s);

  const PoolOptions opts_;
  obs::Registry& reg_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::string> tier_names_;
  std::vector<obs::Gauge*> tier_active_;
  obs::Counter* retries_ = nullptr;
  std::vector<std::thread> health_;

  std::mutex mu_;
  std::condition_variable changed_;   // a worker came up; stop
  std::condition_variable stopping_;  // the health threads: stop
  bool stop_ = false;
  int active_ = -1;
  std::string active_reason_ = "starting";
};

class RetryPolicy {
 public:
  enum class Action { kDeliver, kPassThrough, kRetry };

  RetryPolicy(WorkerPool& pool, int max_attempts) : pool_(pool), max_attempts_(max_attempts) {}

  // The worker for the next attempt, or nullptr when the attempts, or the
  // workers not yet found full, are used up.
  Worker* next();
  // What o means, done to w (take out, full, succeeded); see the header.
  Action judge(Worker& w, const Outcome& o);
  // The answer when next() has given up: the last 429 when a worker was
  // full, else a 503 naming the last failure.
  ApiError give_up() const;
  // The last 429's body, when a worker was full.
  const std::optional<std::string>& busy_body() const { return busy_body_; }
  int attempts() const { return attempts_; }

 private:
  WorkerPool& pool_;
  const int max_attempts_;
  int attempts_ = 0;
  std::set<Worker*> full_;
  std::optional<std::string> busy_body_;
  std::string last_failure_ = "no worker is up";
};

// The threads a server starts per request (a streamed relay) and must join
// before its state goes: spawn() runs fn on a new thread and joins those that
// have finished; join_all() waits for every one.
class OwnedThreads {
 public:
  ~OwnedThreads() { join_all(); }
  void spawn(std::function<void()> fn);
  void join_all();
  size_t running();

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void reap_locked();
  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace tessera::serve::route

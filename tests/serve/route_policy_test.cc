// The router's retry policy (serve/route_policy.h) against fake workers:
// real HTTP servers in this process that answer, refuse, fail, cut a stream,
// hang or are full, one behaviour each. Every outcome class a request can
// meet is one test; the pick order and the hold-down are tested on the pool.
#include "serve/route_policy.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "obs/metrics.h"
#include "ports.h"
#include "serve/fake_worker.h"

namespace tessera::serve::route {
namespace {

using namespace std::chrono_literals;

enum class Behaviour { kAnswer, kServerError, kDeviceError, kFull, kClientError, kCutStream, kHang, kStream };

// One fake worker on 127.0.0.1 (fake_worker.h): /health always 200 (so the
// pool takes it in), POST as its behaviour says.
class FakeWorker {
 public:
  explicit FakeWorker(Behaviour b)
      : behaviour_(b), server_([this](httplib::Server& s) {
          s.Post("/v1/completions", [this](const httplib::Request&, httplib::Response& res) { post(res); });
        }) {}
  ~FakeWorker() { stopping_ = true; }  // a hang ends before the server stops
  std::string url() const { return server_.url(); }
  int posts() const { return posts_; }

 private:
  void post(httplib::Response& res) {
    posts_++;
    switch (behaviour_) {
      case Behaviour::kAnswer:
        res.set_content(R"({"object":"text_completion","choices":[{"text":"hi"}]})", "application/json");
        return;
      case Behaviour::kServerError: return fake::server_error(res);
      case Behaviour::kDeviceError: return fake::device_error(res);
      case Behaviour::kFull: return fake::full(res);
      case Behaviour::kClientError: return fake::client_error(res);
      case Behaviour::kHang:
        for (int i = 0; i < 500 && !stopping_; i++) std::this_thread::sleep_for(10ms);  // 5 s
        res.set_content("{}", "application/json");
        return;
      case Behaviour::kCutStream:
      case Behaviour::kStream: {
        const bool cut = behaviour_ == Behaviour::kCutStream;
        res.set_chunked_content_provider("text/event-stream", [cut](size_t offset, httplib::DataSink& sink) {
          if (offset > 0) {
            if (cut) return false;  // the connection ends mid-stream
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
          }
          const std::string chunk = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
          sink.write(chunk.data(), chunk.size());
          return true;
        });
        return;
      }
    }
  }

  Behaviour behaviour_;
  std::atomic<int> posts_{0};
  std::atomic<bool> stopping_{false};
  fake::LoopbackServer server_;  // last: it stops (and joins) first
};

PoolOptions quick() {
  PoolOptions o;
  o.health_timeout_s = 0.5;
  o.connect_timeout_s = 0.5;
  o.stall_timeout_s = 0.3;
  o.wait_for_worker_s = 0.2;
  o.hold_down_s = 1.0;
  return o;
}

// A pool over the tiers, every worker's /health asked once (no threads).
std::unique_ptr<WorkerPool> make_pool(const std::vector<RouteTier>& tiers, obs::Registry& reg,
                                      const PoolOptions& o = quick()) {
  auto pool = std::make_unique<WorkerPool>(tiers, o, reg);
  for (const auto& w : pool->workers()) pool->check(*w);
  return pool;
}

// One unstreamed request through the policy, as the router runs it: what it
// ended with, and the worker that gave it.
struct Ran {
  RetryPolicy::Action action = RetryPolicy::Action::kRetry;
  bool gave_up = false;
  Outcome last;
  Worker* by = nullptr;
  int attempts = 0;
};
Ran run_request(WorkerPool& pool, RetryPolicy& policy, bool stream = false) {
  Ran r;
  while (Worker* w = policy.next()) {
    std::function<bool(const char*, size_t)> on_data;
    if (stream) on_data = [](const char*, size_t) { return true; };
    r.last = pool.send(*w, "/v1/completions", "{}", on_data);
    r.by = w;
    r.action = policy.judge(*w, r.last);
    if (r.action != RetryPolicy::Action::kRetry) {
      r.attempts = policy.attempts();
      return r;
    }
  }
  r.gave_up = true;
  r.attempts = policy.attempts();
  return r;
}

bool is_up(WorkerPool& pool, const std::string& url) {
  for (const WorkerView& v : pool.view())
    if (v.url == url) return v.up;
  return false;
}

TEST(RoutePolicy, AnAnswerIsDelivered) {
  FakeWorker ok(Behaviour::kAnswer);
  obs::Registry reg;
  auto pool = make_pool({{"cpu", {ok.url()}}}, reg);
  RetryPolicy policy(*pool, 4);
  Ran r = run_request(*pool, policy);
  EXPECT_EQ(r.action, RetryPolicy::Action::kDeliver);
  EXPECT_EQ(r.last.status, 200);
  EXPECT_NE(r.last.body.find("hi"), std::string::npos);
  EXPECT_EQ(r.attempts, 1);
}

TEST(RoutePolicy, ConnectionRefusedTakesTheWorkerOutAndRetriesElsewhere) {
  FakeWorker ok(Behaviour::kAnswer);
  obs::Registry reg;
  // A worker that was up and then went away: it answered /health, then the
  // process died (its port refuses).
  const testing_util::ClosedPort closed;
  const std::string dead = testing_util::url_of(closed);
  auto pool2 = std::make_unique<WorkerPool>(std::vector<RouteTier>{{"gpu", {dead, ok.url()}}}, quick(), reg);
  pool2->health_passed(*pool2->workers()[0], "fake");  // up, as if it had answered
  pool2->check(*pool2->workers()[1]);
  RetryPolicy policy(*pool2, 4);
  Ran r = run_request(*pool2, policy);
  EXPECT_EQ(r.action, RetryPolicy::Action::kDeliver);
  EXPECT_EQ(r.by->url, ok.url());
  EXPECT_FALSE(is_up(*pool2, dead));
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(pool2->view()[0].reason.find("request failed"), 0u) << pool2->view()[0].reason;
}

TEST(RoutePolicy, AServerErrorBeforeTheFirstTokenIsRetriedOnTheNextTier) {
  FakeWorker bad(Behaviour::kServerError), ok(Behaviour::kAnswer);
  obs::Registry reg;
  auto pool = make_pool({{"gpu", {bad.url()}}, {"cpu", {ok.url()}}}, reg);
  EXPECT_EQ(pool->active_tier(), 0);
  RetryPolicy policy(*pool, 4);
  Ran r = run_request(*pool, policy);
  EXPECT_EQ(r.action, RetryPolicy::Action::kDeliver);
  EXPECT_EQ(r.by->tier_name, "cpu");
  EXPECT_FALSE(is_up(*pool, bad.url()));
  EXPECT_EQ(pool->view()[0].reason, "HTTP 500: the engine failed");
  EXPECT_EQ(pool->active_tier(), 1);  // the failover
  EXPECT_EQ(bad.posts(), 1);
}

TEST(RoutePolicy, ADeviceErrorIsLabelledSo) {
  EXPECT_EQ(failure_of(500, R"({"error":{"message":"device error: Xid 79"}})").first, "device_error");
  EXPECT_EQ(failure_of(502, "not json").first, "http_5xx");
  EXPECT_EQ(failure_of(502, "not json").second, "HTTP 502");
  FakeWorker bad(Behaviour::kDeviceError);
  obs::Registry reg;
  auto pool = make_pool({{"gpu", {bad.url()}}}, reg);
  RetryPolicy policy(*pool, 4);
  Ran r = run_request(*pool, policy);
  EXPECT_TRUE(r.gave_up);
  const ApiError e = policy.give_up();
  EXPECT_EQ(e.http, 503);
  EXPECT_NE(e.message.find("device error: Xid 79"), std::string::npos) << e.message;
  EXPECT_EQ(reg.counter("tessera_route_failovers_total", "", {{"from", "gpu"}, {"to", "none"}, {"reason", "device_error"}})
                .value(),
            1);
}

TEST(RoutePolicy, ACutStreamTakesTheWorkerOut) {
  FakeWorker cut(Behaviour::kCutStream), ok(Behaviour::kStream);
  obs::Registry reg;
  auto pool = make_pool({{"gpu", {cut.url()}}, {"cpu", {ok.url()}}}, reg);
  RetryPolicy policy(*pool, 4);
  Ran r = run_request(*pool, policy, /*stream=*/true);
  EXPECT_EQ(r.action, RetryPolicy::Action::kDeliver);
  EXPECT_EQ(r.by->url, ok.url());
  EXPECT_FALSE(is_up(*pool, cut.url()));
  EXPECT_EQ(pool->view()[0].reason, "the connection broke mid-answer");
}

TEST(RoutePolicy, AHangPastTheStallDeadlineTakesTheWorkerOut) {
  FakeWorker hung(Behaviour::kHang), ok(Behaviour::kAnswer);
  obs::Registry reg;
  auto pool = make_pool({{"gpu", {hung.url()}}, {"cpu", {ok.url()}}}, reg);
  RetryPolicy policy(*pool, 4);
  const auto t0 = Clock::now();
  Ran r = run_request(*pool, policy);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r.action, RetryPolicy::Action::kDeliver);
  EXPECT_EQ(r.by->url, ok.url());
  EXPECT_FALSE(is_up(*pool, hung.url()));
  EXPECT_EQ(pool->view()[0].reason.rfind("silent for", 0), 0u) << pool->view()[0].reason;
  EXPECT_LT(took, 3.0);  // the stall deadline (0.3 s), not the worker's 5 s
}

TEST(RoutePolicy, AFullWorkerIsSkippedNotTakenOut) {
  FakeWorker full(Behaviour::kFull), ok(Behaviour::kAnswer);
  obs::Registry reg;
  auto pool = make_pool({{"gpu", {full.url(), ok.url()}}}, reg);
  // Both idle: the first in the list is picked first.
  RetryPolicy policy(*pool, 4);
  Ran r = run_request(*pool, policy);
  EXPECT_EQ(r.action, RetryPolicy::Action::kDeliver);
  EXPECT_EQ(r.by->url, ok.url());
  EXPECT_TRUE(is_up(*pool, full.url()));  // busy is not broken
  EXPECT_EQ(full.posts(), 1);
}

TEST(RoutePolicy, EveryWorkerFullGivesTheClientThe429) {
  FakeWorker a(Behaviour::kFull), b(Behaviour::kFull);
  obs::Registry reg;
  auto pool = make_pool({{"cpu", {a.url(), b.url()}}}, reg);
  RetryPolicy policy(*pool, 8);
  Ran r = run_request(*pool, policy);
  EXPECT_TRUE(r.gave_up);
  EXPECT_EQ(r.attempts, 2);  // each full worker once, not 8 tries
  EXPECT_EQ(policy.give_up().http, 429);
  ASSERT_TRUE(policy.busy_body());
  EXPECT_NE(policy.busy_body()->find("queue_full"), std::string::npos);
  EXPECT_TRUE(is_up(*pool, a.url()));
  EXPECT_TRUE(is_up(*pool, b.url()));
}

TEST(RoutePolicy, AClientErrorIsPassedThroughAndNotRetried) {
  FakeWorker w(Behaviour::kClientError), other(Behaviour::kAnswer);
  obs::Registry reg;
  auto pool = make_pool({{"cpu", {w.url(), other.url()}}}, reg);
  RetryPolicy policy(*pool, 4);
  Ran r = run_request(*pool, policy);
  EXPECT_EQ(r.action, RetryPolicy::Action::kPassThrough);
  EXPECT_EQ(r.last.status, 400);
  EXPECT_EQ(other.posts(), 0);
  EXPECT_TRUE(is_up(*pool, w.url()));
}

TEST(RoutePolicy, TheAttemptsAreBounded) {
  FakeWorker a(Behaviour::kServerError), b(Behaviour::kServerError), c(Behaviour::kServerError);
  obs::Registry reg;
  auto pool = make_pool({{"cpu", {a.url(), b.url(), c.url()}}}, reg);
  RetryPolicy policy(*pool, 2);
  Ran r = run_request(*pool, policy);
  EXPECT_TRUE(r.gave_up);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(a.posts() + b.posts() + c.posts(), 2);
  EXPECT_EQ(reg.counter("tessera_route_retries_total", "").value(), 1);
  EXPECT_EQ(policy.give_up().http, 503);
}

TEST(RoutePolicy, AnAbortedAttemptIsRetriedWithoutATakeOut) {
  FakeWorker a(Behaviour::kAnswer);
  obs::Registry reg;
  auto pool = make_pool({{"cpu", {a.url()}}}, reg);
  RetryPolicy policy(*pool, 4);
  Worker* w = policy.next();
  ASSERT_NE(w, nullptr);
  Outcome aborted;
  aborted.kind = Outcome::kAborted;
  EXPECT_EQ(policy.judge(*w, aborted), RetryPolicy::Action::kRetry);
  pool->unpick(*w);
  EXPECT_TRUE(is_up(*pool, a.url()));
  EXPECT_NE(policy.give_up().message.find("was taken out"), std::string::npos);
}

TEST(RoutePolicy, PickPrefersTheFirstTierThenTheFewestInFlight) {
  FakeWorker g1(Behaviour::kAnswer), g2(Behaviour::kAnswer), c1(Behaviour::kAnswer);
  obs::Registry reg;
  auto pool = make_pool({{"gpu", {g1.url(), g2.url()}}, {"cpu", {c1.url()}}}, reg);
  Worker* first = pool->pick({});
  Worker* second = pool->pick({});
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->url, g1.url());
  EXPECT_EQ(second->url, g2.url());  // g1 has one in flight
  Worker* third = pool->pick({first, second});
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->url, c1.url());  // the gpu tier's workers are skipped
  for (Worker* w : {first, second, third}) pool->unpick(*w);
  // With the gpu tier out, everything goes to cpu.
  pool->take_out(*pool->workers()[0], "connection", "test");
  pool->take_out(*pool->workers()[1], "connection", "test");
  EXPECT_EQ(pool->active_tier(), 1);
  Worker* w = pool->pick({});
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->url, c1.url());
  pool->unpick(*w);
}

TEST(RoutePolicy, NoWorkerUpWaitsThenGivesUp) {
  obs::Registry reg;
  const testing_util::ClosedPort closed;
  auto pool = make_pool({{"cpu", {testing_util::url_of(closed)}}}, reg);
  const auto t0 = Clock::now();
  EXPECT_EQ(pool->pick({}), nullptr);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(waited, 0.15);  // wait_for_worker_s = 0.2
  EXPECT_LT(waited, 2.0);
  RetryPolicy policy(*pool, 4);
  EXPECT_EQ(policy.next(), nullptr);
  EXPECT_EQ(policy.give_up().http, 503);
  EXPECT_NE(policy.give_up().message.find("no worker is up"), std::string::npos);
}

TEST(RoutePolicy, TheHoldDownDoublesWithEachStrike) {
  obs::Registry reg;
  PoolOptions o = quick();
  o.hold_down_s = 10;
  WorkerPool pool({{"cpu", {"http://127.0.0.1:1"}}}, o, reg);
  Worker& w = *pool.workers()[0];
  const Clock::time_point t0 = Clock::now();
  pool.health_passed(w, "m", t0);  // the first time: up at once
  EXPECT_TRUE(w.up);
  pool.take_out(w, "http_5xx", "strike 1");
  pool.health_passed(w, "m", t0 + 1s);
  pool.health_passed(w, "m", t0 + 10s);  // 9 s of 10
  EXPECT_FALSE(w.up);
  EXPECT_EQ(pool.view()[0].reason, "recovering: healthy for 9.0 of 10.0 s");
  pool.health_passed(w, "m", t0 + 11s);
  EXPECT_TRUE(w.up);
  // Taken out again before it answered a request: 20 s now.
  pool.take_out(w, "http_5xx", "strike 2");
  pool.health_passed(w, "m", t0 + 20s);
  pool.health_passed(w, "m", t0 + 35s);
  EXPECT_FALSE(w.up);
  pool.health_passed(w, "m", t0 + 40s);
  EXPECT_TRUE(w.up);
  // A missed health check restarts the hold-down.
  pool.take_out(w, "http_5xx", "strike 3");
  pool.health_passed(w, "m", t0 + 50s);
  pool.health_missed(w);  // one miss of health_failures = 2: not out, but the clock restarts
  pool.health_passed(w, "m", t0 + 80s);
  pool.health_passed(w, "m", t0 + 95s);  // 15 s of 40
  EXPECT_FALSE(w.up);
  // An answered request clears the strikes: the next hold-down is 10 s.
  pool.health_passed(w, "m", t0 + 121s);
  EXPECT_TRUE(w.up);
  pool.succeeded(w);
  pool.take_out(w, "http_5xx", "after a success");
  pool.health_passed(w, "m", t0 + 200s);
  pool.health_passed(w, "m", t0 + 210s);
  EXPECT_TRUE(w.up);
}

TEST(RoutePolicy, MissedHealthDeadlinesTakeAWorkerOut) {
  obs::Registry reg;
  WorkerPool pool({{"cpu", {"http://127.0.0.1:1"}}}, quick(), reg);
  Worker& w = *pool.workers()[0];
  pool.health_passed(w, "m");
  pool.health_missed(w);
  EXPECT_TRUE(w.up);  // health_failures = 2
  pool.health_missed(w);
  EXPECT_FALSE(w.up);
  EXPECT_EQ(pool.view()[0].reason, "no /health answer within 0.5 s, 2 times in a row");
}

TEST(RoutePolicy, StopEndsAnAttemptInFlightAndPick) {
  FakeWorker hung(Behaviour::kHang);
  obs::Registry reg;
  PoolOptions o = quick();
  o.stall_timeout_s = 30;
  auto pool = make_pool({{"cpu", {hung.url()}}}, reg, o);
  Worker* w = pool->pick({});
  ASSERT_NE(w, nullptr);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    pool->stop();
  });
  const auto t0 = Clock::now();
  Outcome out = pool->send(*w, "/v1/completions", "{}", nullptr);
  stopper.join();
  EXPECT_EQ(out.kind, Outcome::kAborted);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  EXPECT_EQ(pool->pick({}), nullptr);
}

TEST(OwnedThreads, SpawnedThreadsAreJoined) {
  OwnedThreads threads;
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; i++) threads.spawn([&] {
      std::this_thread::sleep_for(5ms);
      ran++;
    });
  threads.join_all();
  EXPECT_EQ(ran.load(), 8);
  EXPECT_EQ(threads.running(), 0u);
  threads.spawn([&] { ran++; });
  for (int i = 0; i < 200 && threads.running() > 0; i++) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(threads.running(), 0u);  // a finished thread is reaped
  EXPECT_EQ(ran.load(), 9);
}

}  // namespace
}  // namespace tessera::serve::route

#include "serve/route_policy.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve/http.h"

namespace tessera::serve::route {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxErrorBody = 64 << 10;

// j[key] when it is a string, else "".
std::string string_at(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

time_t micros(double s) { return static_cast<time_t>(s * 1e6); }

// A client of one worker: plain, or TLS that verifies the worker's
// certificate against worker_ca (the system's CAs when empty) and presents
// worker_cert / worker_key when set.
std::unique_ptr<httplib::Client> worker_client(const Address& a, const PoolOptions& opts) {
  if (!a.tls) return std::make_unique<httplib::Client>(a.host, a.port);
  const std::string url = fmt::format("https://{}:{}", a.host, a.port);
  auto c = opts.worker_cert.empty() ? std::make_unique<httplib::Client>(url)
                                    : std::make_unique<httplib::Client>(url, opts.worker_cert, opts.worker_key);
  if (!opts.worker_ca.empty()) c->set_ca_cert_path(opts.worker_ca);
  c->enable_server_certificate_verification(true);
  return c;
}

}  // namespace

void Attempt::abort() {
  aborted = true;
  cli->stop();
}

Result<Address> parse_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(
        fmt::format("worker URL '{}': {} (want http://HOST:PORT or https://HOST:PORT)", url, why));
  };
  const bool tls = url.rfind("https://", 0) == 0;
  if (!tls && url.rfind("http://", 0) != 0) return bad("not an http:// or https:// URL");
  std::string rest = url.substr(tls ? 8 : 7);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host:port");
  if (rest.find('/') != std::string::npos) return bad("a path is not taken");
  Address a;
  a.tls = tls;
  a.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return bad(fmt::format("port '{}' is not a number", port));
  a.port = std::stoi(port);
  if (a.port < 1 || a.port > 65535) return bad(fmt::format("port {} is out of range", a.port));
  return a;
}

std::pair<std::string, std::string> failure_of(int status, const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  const std::string message = j.is_object() && j.contains("error") ? string_at(j["error"], "message") : "";
  const bool device = message.rfind("device error", 0) == 0;
  return {device ? "device_error" : "http_5xx",
          message.empty() ? fmt::format("HTTP {}", status) : fmt::format("HTTP {}: {}", status, message)};
}

// ---- WorkerPool ----------------------------------------------------------------

WorkerPool::WorkerPool(const std::vector<RouteTier>& tiers, const PoolOptions& opts, obs::Registry& registry)
    : opts_(opts), reg_(registry) {
  for (size_t t = 0; t < tiers.size(); t++) {
    const RouteTier& tier = tiers[t];
    tier_names_.push_back(tier.name);
    tier_active_.push_back(&registry.gauge("tessera_route_tier_active",
                                           "1 for the tier requests go to now, 0 for the others", {{"tier", tier.name}}));
    for (const std::string& url : tier.urls) {
      auto w = std::make_unique<Worker>();
      w->url = url;
      w->addr = parse_url(url).value();
      w->tier = t;
      w->tier_name = tier.name;
      w->up_gauge = &registry.gauge("tessera_route_worker_up", "1 while the router sends the worker requests",
                                    {{"tier", tier.name}, {"worker", url}});
      workers_.push_back(std::move(w));
    }
  }
  retries_ = &registry.counter("tessera_route_retries_total",
                               "Attempts after the first: a request sent again, or a stream continued, elsewhere");
}

WorkerPool::~WorkerPool() { stop(); }

void WorkerPool::start_health(double interval_s) {
  for (auto& w : workers_) check(*w);
  {
    std::lock_guard<std::mutex> lock(mu_);
    update_active_locked("recovered", "first health check");
  }
  for (auto& w : workers_) health_.emplace_back([this, p = w.get(), interval_s] { health_loop(*p, interval_s); });
}

void WorkerPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& w : workers_)
      for (Attempt* a : w->attempts) a->abort();
  }
  changed_.notify_all();
  stopping_.notify_all();
  for (std::thread& t : health_)
    if (t.joinable()) t.join();
  health_.clear();
}

void WorkerPool::update_active_locked(const std::string& label, const std::string& why) {
  int now = -1;
  for (const auto& w : workers_)
    if (w->up && (now < 0 || static_cast<int>(w->tier) < now)) now = static_cast<int>(w->tier);
  if (now == active_) return;
  const std::string from = active_ < 0 ? "none" : tier_names_[active_];
  const std::string to = now < 0 ? "none" : tier_names_[now];
  std::fprintf(stderr, "route: active tier %s -> %s: %s\n", from.c_str(), to.c_str(), why.c_str());
  std::fflush(stderr);
  if (active_ >= 0)
    reg_.counter("tessera_route_failovers_total", "Switches of the active tier",
                 {{"from", from}, {"to", to}, {"reason", label}})
        .add(1);
  for (size_t t = 0; t < tier_active_.size(); t++) tier_active_[t]->set(static_cast<int>(t) == now ? 1 : 0);
  active_ = now;
  active_reason_ = why;
}

void WorkerPool::take_out(Worker& w, const std::string& label, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  w.passing_since.reset();
  w.reason = reason;
  if (!w.up) return;
  w.up = false;
  w.strikes++;
  w.up_gauge->set(0);
  std::fprintf(stderr, "route: worker %s (%s) out: %s\n", w.url.c_str(), w.tier_name.c_str(), reason.c_str());
  for (Attempt* a : w.attempts) a->abort();
  update_active_locked(label, fmt::format("{} worker {}: {}", w.tier_name, w.url, reason));
}

void WorkerPool::health_passed(Worker& w, const std::string& model, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  w.missed = 0;
  if (!model.empty()) w.served_model = model;
  if (w.up) return;
  if (!w.passing_since) w.passing_since = now;
  const double held = std::chrono::duration<double>(now - *w.passing_since).count();
  // The first time at once; after a failure, only once it has held: the
  // hold-down doubles with each time out since the worker last answered a
  // request (a worker whose /health is fine but whose requests fail is let
  // back less and less often), up to 32x.
  const double hold = opts_.hold_down_s * static_cast<double>(1 << std::clamp(w.strikes - 1, 0, 5));
  if (w.ever_up && held < hold) {
    w.reason = fmt::format("recovering: healthy for {:.1f} of {:.1f} s", held, hold);
    return;
  }
  const bool again = w.ever_up;
  w.up = w.ever_up = true;
  w.reason = "ok";
  w.up_gauge->set(1);
  std::fprintf(stderr, "route: worker %s (%s) up\n", w.url.c_str(), w.tier_name.c_str());
  update_active_locked("recovered", fmt::format("{} worker {} is {}", w.tier_name, w.url, again ? "healthy again" : "up"));
  changed_.notify_all();
}

void WorkerPool::health_missed(Worker& w) {
  int missed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    missed = ++w.missed;
    w.passing_since.reset();
  }
  if (missed >= opts_.health_failures)
    take_out(w, "timeout",
             fmt::format("no /health answer within {:.1f} s, {} times in a row", opts_.health_timeout_s, missed));
}

void WorkerPool::succeeded(Worker& w) {
  std::lock_guard<std::mutex> lock(mu_);
  w.strikes = 0;
}

void WorkerPool::check(Worker& w) {
  std::unique_ptr<httplib::Client> client = worker_client(w.addr, opts_);
  httplib::Client& c = *client;
  c.set_connection_timeout(0, micros(opts_.connect_timeout_s));
  c.set_read_timeout(0, micros(opts_.health_timeout_s));
  c.set_write_timeout(0, micros(opts_.health_timeout_s));
  httplib::Result r = c.Get("/health");
  if (!r) {
    const httplib::Error e = r.error();
    if (e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout) {
      take_out(w, "connection", fmt::format("cannot connect ({})", httplib::to_string(e)));
      return;
    }
    health_missed(w);
    return;
  }
  const json j = json::parse(r->body, nullptr, false);
  auto field = [&](const char* k) { return string_at(j, k); };
  if (r->status == 200) {
    health_passed(w, field("model"));
    return;
  }
  const std::string status = field("status");
  if (status == "device_error") {
    take_out(w, "device_error", fmt::format("device error: {}", field("reason")));
  } else {
    take_out(w, "unhealthy", fmt::format("/health {}{}", r->status, status.empty() ? "" : ": " + status));
  }
}

void WorkerPool::health_loop(Worker& w, double interval_s) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      stopping_.wait_for(lock, std::chrono::duration<double>(interval_s), [&] { return stop_; });
      if (stop_) return;
    }
    check(w);
  }
}

Worker* WorkerPool::pick(const std::set<Worker*>& skip) {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.wait_for_worker_s));
  for (;;) {
    if (stop_) return nullptr;
    Worker* best = nullptr;
    bool any_up = false;
    for (const auto& w : workers_) {
      if (!w->up) continue;
      any_up = true;
      if (skip.count(w.get())) continue;
      if (!best || w->tier < best->tier || (w->tier == best->tier && w->inflight < best->inflight)) best = w.get();
    }
    if (best) {
      best->inflight++;
      return best;
    }
    // Every worker up has been tried (and was full): no point waiting.
    if (any_up) return nullptr;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return nullptr;
  }
}

void WorkerPool::unpick(Worker& w) {
  std::lock_guard<std::mutex> lock(mu_);
  w.inflight--;
}

Outcome WorkerPool::send(Worker& w, const std::string& path, const std::string& body,
                         const std::function<bool(const char*, size_t)>& on_data) {
  Attempt a;
  a.cli = worker_client(w.addr, opts_);
  a.cli->set_connection_timeout(0, micros(opts_.connect_timeout_s));
  a.cli->set_read_timeout(0, micros(opts_.stall_timeout_s));
  a.cli->set_write_timeout(0, micros(opts_.stall_timeout_s));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!w.up || stop_) a.aborted = true;
    w.attempts.insert(&a);
  }
  Outcome o;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  if (!opts_.worker_api_key.empty()) req.set_header("Authorization", "Bearer " + opts_.worker_api_key);
  req.response_handler = [&](const httplib::Response& r) {
    o.status = r.status;
    return !a.aborted;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    if (a.aborted) return false;
    if (o.status == 200 && on_data) return on_data(d, n);
    if (o.status == 200 || o.body.size() < kMaxErrorBody) o.body.append(d, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const Clock::time_point t0 = Clock::now();
  const bool sent = !a.aborted && a.cli->send(req, res, err);
  {
    std::lock_guard<std::mutex> lock(mu_);
    w.attempts.erase(&a);
    w.inflight--;
  }
  if (a.aborted) {
    o.kind = Outcome::kAborted;
    return o;
  }
  if (!sent && !(err == httplib::Error::Canceled && o.status == 200)) {
    o.kind = Outcome::kFailed;
    o.label = "connection";
    const double took = seconds_since(t0);
    o.reason = err == httplib::Error::Read && took >= opts_.stall_timeout_s
                   ? fmt::format("silent for {:.0f} s (--stall-timeout)", opts_.stall_timeout_s)
                   : err == httplib::Error::Read
                       ? fmt::format("the connection broke {}", o.status == 0 ? "before an answer" : "mid-answer")
                       : fmt::format("request failed: {}", httplib::to_string(err));
    return o;
  }
  o.kind = Outcome::kAnswered;
  return o;
}

std::string WorkerPool::served_model(Worker& w) {
  std::lock_guard<std::mutex> lock(mu_);
  return w.served_model;
}

std::string WorkerPool::any_served_model() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : workers_)
    if (!w->served_model.empty()) return w->served_model;
  return "";
}

int WorkerPool::active_tier() {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

std::string WorkerPool::active_reason() {
  std::lock_guard<std::mutex> lock(mu_);
  return active_reason_;
}

std::vector<WorkerView> WorkerPool::view() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerView> v;
  for (const auto& w : workers_) v.push_back({w->url, w->tier_name, w->reason, w->served_model, w->tier, w->up, w->inflight});
  return v;
}

// ---- RetryPolicy ---------------------------------------------------------------

Worker* RetryPolicy::next() {
  if (attempts_ >= max_attempts_) return nullptr;
  Worker* w = pool_.pick(full_);
  if (!w) return nullptr;
  if (attempts_ > 0) pool_.count_retry();
  attempts_++;
  return w;
}

RetryPolicy::Action RetryPolicy::judge(Worker& w, const Outcome& o) {
  if (o.kind == Outcome::kAborted) {
    last_failure_ = fmt::format("worker {} was taken out", w.url);
    return Action::kRetry;
  }
  if (o.kind == Outcome::kFailed) {
    pool_.take_out(w, o.label, o.reason);
    last_failure_ = o.reason;
    return Action::kRetry;
  }
  if (o.status == 200) {
    pool_.succeeded(w);
    return Action::kDeliver;
  }
  if (o.status == 429) {
    full_.insert(&w);
    busy_body_ = o.body;
    return Action::kRetry;
  }
  if (o.status >= 500) {
    auto [label, reason] = failure_of(o.status, o.body);
    pool_.take_out(w, label, reason);
    last_failure_ = reason;
    return Action::kRetry;
  }
  return Action::kPassThrough;  // the client's error
}

ApiError RetryPolicy::give_up() const {
  if (busy_body_) return api_error(429, "every worker is busy", "rate_limit_error", "", "queue_full");
  return api_error(503, fmt::format("no worker could serve the request: {}", last_failure_), "service_unavailable");
}

// ---- OwnedThreads --------------------------------------------------------------

void OwnedThreads::reap_locked() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

void OwnedThreads::spawn(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  reap_locked();
  auto done = std::make_shared<std::atomic<bool>>(false);
  entries_.push_back({std::thread([fn = std::move(fn), done] {
                        fn();
                        done->store(true);
                      }),
                      done});
}

void OwnedThreads::join_all() {
  std::vector<Entry> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(entries_);
  }
  for (Entry& e : all)
    if (e.thread.joinable()) e.thread.join();
}

size_t OwnedThreads::running() {
  std::lock_guard<std::mutex> lock(mu_);
  reap_locked();
  return entries_.size();
}

}  // namespace tessera::serve::route

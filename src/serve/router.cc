#include "serve/router.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "serve/http.h"

namespace tessera::serve {

using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kCompletionsDefaultMaxTokens = 16;  // OpenAI's, and tessera serve's
constexpr size_t kMaxErrorBody = 64 << 10;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// j[key] when it is a boolean (a client's null or other type: false; the
// worker judges the request).
bool flag_at(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// j[key] when it is a string, else "".
std::string string_at(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Address {
  std::string host;
  int port = 0;
  bool tls = false;  // https://
};

Result<Address> parse_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format("worker URL '{}': {} (want http://HOST:PORT or https://HOST:PORT)", url, why));
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

// A client of one worker: plain, or TLS that verifies the worker's
// certificate against opts.worker_ca (the system's CAs when empty) and
// presents opts.worker_cert / worker_key when set.
std::unique_ptr<httplib::Client> worker_client(const Address& a, const RouterOptions& opts) {
  if (!a.tls) return std::make_unique<httplib::Client>(a.host, a.port);
  const std::string url = fmt::format("https://{}:{}", a.host, a.port);
  auto c = opts.worker_cert.empty() ? std::make_unique<httplib::Client>(url)
                                    : std::make_unique<httplib::Client>(url, opts.worker_cert, opts.worker_key);
  if (!opts.worker_ca.empty()) c->set_ca_cert_path(opts.worker_ca);
  c->enable_server_certificate_verification(true);
  return c;
}

// One request sent to one worker; abort() from another thread ends it.
struct Attempt {
  std::unique_ptr<httplib::Client> cli;
  std::atomic<bool> aborted{false};
  void abort() {
    aborted = true;
    cli->stop();
  }
};

}  // namespace

Result<RouteTier> parse_route_tier(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    return Status::InvalidArgument(fmt::format("--tier '{}': want NAME=URL[,URL...]", spec));
  RouteTier t;
  t.name = spec.substr(0, eq);
  if (t.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
    return Status::InvalidArgument(
        fmt::format("--tier '{}': the name '{}' must be lower-case letters, digits, '_' or '-'", spec, t.name));
  std::string urls = spec.substr(eq + 1);
  size_t start = 0;
  while (start <= urls.size()) {
    const size_t comma = std::min(urls.find(',', start), urls.size());
    const std::string u = urls.substr(start, comma - start);
    if (u.empty()) return Status::InvalidArgument(fmt::format("--tier '{}': an empty worker URL", spec));
    if (Result<Address> a = parse_url(u); !a.ok()) return a.status();
    t.urls.push_back(u);
    start = comma + 1;
  }
  return t;
}

namespace {

struct Worker {
  std::string url;
  Address addr;
  size_t tier = 0;
  std::string tier_name;
  obs::Gauge* up_gauge = nullptr;
  std::thread health;
  // Under State::mu.
  bool up = false;
  bool ever_up = false;
  std::string reason = "not checked yet";
  int missed = 0;  // health deadlines missed in a row
  int strikes = 0; // taken out since its last request answered (circuit breaker)
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

// What a streamed request has been sent so far (the router's state of a
// relayed stream, carried across workers).
struct StreamProgress {
  json id = nullptr, created = nullptr;
  std::optional<std::vector<int>> prompt_ids;
  std::vector<int> generated;
  size_t sent_bytes = 0;
  bool role_sent = false;
  std::optional<std::string> finish_reason;
  bool usage_sent = false;
  bool done = false;
};

}  // namespace

struct Router::State {
  RouterOptions opts;
  obs::Registry& reg;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::string> tier_names;

  std::mutex mu;
  std::condition_variable changed;   // a worker came up (requests waiting for one); stop
  std::condition_variable stopping;  // the health threads: stop
  int active = -1;                  // tier, -1: none
  std::string active_reason = "starting";
  int inflight = 0;
  std::condition_variable idle;
  bool stop = false;
  std::atomic<bool> draining{false};

  obs::Counter* retries = nullptr;
  obs::Gauge* inflight_gauge = nullptr;
  std::vector<obs::Gauge*> tier_active;
  std::vector<obs::Histogram*> latency;

  State(const RouterOptions& o, obs::Registry& r) : opts(o), reg(r) {}

  obs::Counter& requests(int code) {
    return reg.counter("tessera_route_requests_total", "Requests answered by the router, by HTTP status",
                       {{"code", std::to_string(code)}});
  }
  obs::Counter& failovers(const std::string& from, const std::string& to, const std::string& reason) {
    return reg.counter("tessera_route_failovers_total", "Switches of the active tier",
                       {{"from", from}, {"to", to}, {"reason", reason}});
  }

  void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.http;
    if (e.http == 429 || e.http == 503) res.set_header("Retry-After", "1");
    res.set_content(dump(e.body()), "application/json");
    requests(e.http).add(1);
  }

  std::string model_name() {
    if (!opts.model_name.empty()) return opts.model_name;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& w : workers)
      if (!w->served_model.empty()) return w->served_model;
    return "model";
  }

  // The first tier with a worker up; on a change, the log line and metrics.
  void update_active_locked(const std::string& label, const std::string& why) {
    int now = -1;
    for (const auto& w : workers) {
      if (w->up && (now < 0 || static_cast<int>(w->tier) < now)) now = static_cast<int>(w->tier);
    }
    if (now == active) return;
    const std::string from = active < 0 ? "none" : tier_names[active];
    const std::string to = now < 0 ? "none" : tier_names[now];
    std::fprintf(stderr, "route: active tier %s -> %s: %s\n", from.c_str(), to.c_str(), why.c_str());
    std::fflush(stderr);
    if (active >= 0) failovers(from, to, label).add(1);
    for (size_t t = 0; t < tier_active.size(); t++) tier_active[t]->set(static_cast<int>(t) == now ? 1 : 0);
    active = now;
    active_reason = why;
  }

  // Takes w out (if up) and aborts its requests in flight.
  void take_out(Worker& w, const std::string& label, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
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

  void health_passed(Worker& w, const std::string& model) {
    std::lock_guard<std::mutex> lock(mu);
    w.missed = 0;
    if (!model.empty()) w.served_model = model;
    if (w.up) return;
    const Clock::time_point now = Clock::now();
    if (!w.passing_since) w.passing_since = now;
    const double held = std::chrono::duration<double>(now - *w.passing_since).count();
    // The first time at once; after a failure, only once it has held: the
    // hold-down doubles with each time out since the worker last answered a
    // request (a worker whose /health is fine but whose requests fail is let
    // back less and less often), up to 32x.
    const double hold = opts.hold_down_s * static_cast<double>(1 << std::clamp(w.strikes - 1, 0, 5));
    if (w.ever_up && held < hold) {
      w.reason = fmt::format("recovering: healthy for {:.1f} of {:.1f} s", held, hold);
      return;
    }
    const bool again = w.ever_up;
    w.up = w.ever_up = true;
    w.reason = "ok";
    w.up_gauge->set(1);
    std::fprintf(stderr, "route: worker %s (%s) up\n", w.url.c_str(), w.tier_name.c_str());
    update_active_locked("recovered",
                         fmt::format("{} worker {} is {}", w.tier_name, w.url, again ? "healthy again" : "up"));
    changed.notify_all();
  }

  // A request answered: the circuit breaker's count starts again.
  void succeeded(Worker& w) {
    std::lock_guard<std::mutex> lock(mu);
    w.strikes = 0;
  }

  void check(Worker& w) {
    std::unique_ptr<httplib::Client> client = worker_client(w.addr, opts);
    httplib::Client& c = *client;
    const auto us = [](double s) { return static_cast<time_t>(s * 1e6); };
    c.set_connection_timeout(0, us(opts.connect_timeout_s));
    c.set_read_timeout(0, us(opts.health_timeout_s));
    c.set_write_timeout(0, us(opts.health_timeout_s));
    httplib::Result r = c.Get("/health");
    if (!r) {
      const httplib::Error e = r.error();
      if (e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout) {
        take_out(w, "connection", fmt::format("cannot connect ({})", httplib::to_string(e)));
        return;
      }
      int missed;
      {
        std::lock_guard<std::mutex> lock(mu);
        missed = ++w.missed;
        w.passing_since.reset();
      }
      if (missed >= opts.health_failures)
        take_out(w, "timeout",
                 fmt::format("no /health answer within {:.1f} s, {} times in a row", opts.health_timeout_s, missed));
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

  void health_loop(Worker& w) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        stopping.wait_for(lock, std::chrono::duration<double>(opts.health_interval_s), [&] { return stop; });
        if (stop) return;
      }
      check(w);
    }
  }

  // The worker for an attempt: in the first tier with a worker up that is
  // not in `skip`, the one with the fewest in flight. Waits up to
  // wait_for_worker_s while none is up; nullptr then.
  Worker* pick(const std::set<Worker*>& skip) {
    std::unique_lock<std::mutex> lock(mu);
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.wait_for_worker_s));
    for (;;) {
      Worker* best = nullptr;
      bool any_up = false;
      for (const auto& w : workers) {
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
      if (any_up || stop) return nullptr;
      if (changed.wait_until(lock, deadline) == std::cv_status::timeout) return nullptr;
    }
  }

  // Sends body to w's path. With on_data, a 200 answer's body goes to it as
  // it arrives (return false to stop); otherwise it is collected.
  Outcome send(Worker& w, const std::string& path, const json& body,
               const std::function<bool(const char*, size_t)>& on_data) {
    Attempt a;
    a.cli = worker_client(w.addr, opts);
    const auto us = [](double s) { return static_cast<time_t>(s * 1e6); };
    a.cli->set_connection_timeout(0, us(opts.connect_timeout_s));
    a.cli->set_read_timeout(0, us(opts.stall_timeout_s));
    a.cli->set_write_timeout(0, us(opts.stall_timeout_s));
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!w.up) a.aborted = true;
      w.attempts.insert(&a);
    }
    Outcome o;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = dump(body);
    req.set_header("Content-Type", "application/json");
    if (!opts.worker_api_key.empty()) req.set_header("Authorization", "Bearer " + opts.worker_api_key);
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
      std::lock_guard<std::mutex> lock(mu);
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
      o.reason = err == httplib::Error::Read && took >= opts.stall_timeout_s
                     ? fmt::format("silent for {:.0f} s (--stall-timeout)", opts.stall_timeout_s)
                     : err == httplib::Error::Read
                         ? fmt::format("the connection broke {}", o.status == 0 ? "before an answer" : "mid-answer")
                         : fmt::format("request failed: {}", httplib::to_string(err));
      return o;
    }
    o.kind = Outcome::kAnswered;
    return o;
  }
};

namespace {

// The label and reason a worker is taken out for, from its error answer.
std::pair<std::string, std::string> failure_of(int status, const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  const std::string message = j.is_object() && j.contains("error") ? string_at(j["error"], "message") : "";
  const bool device = message.rfind("device error", 0) == 0;
  return {device ? "device_error" : "http_5xx",
          message.empty() ? fmt::format("HTTP {}", status) : fmt::format("HTTP {}: {}", status, message)};
}

// The relay of one streamed request between its worker thread and the
// client's HTTP thread.
struct Relay {
  std::mutex mu;
  std::condition_variable cv;
  enum Phase { kPending, kStreaming, kAnswered } phase = kPending;
  int status = 0;             // kAnswered
  std::string answer;         // kAnswered: the body
  std::string out;            // kStreaming: bytes for the client not yet written
  bool finished = false;      // kStreaming: nothing more will be added
  std::atomic<bool> client_gone{false};  // checked at the worker's next chunk
  std::string tier;                      // of the worker being tried (X-Tessera-Tier)

  void emit(std::string bytes, bool last = false) {
    std::lock_guard<std::mutex> lock(mu);
    phase = kStreaming;
    out += bytes;
    if (last) finished = true;
    cv.notify_all();
  }
  void answer_with(int s, std::string body) {
    std::lock_guard<std::mutex> lock(mu);
    phase = kAnswered;
    status = s;
    answer = std::move(body);
    cv.notify_all();
  }
};

}  // namespace

namespace {

// What a client asked that the relay must honour.
struct ClientAsk {
  bool chat = false;
  bool include_usage = false;
  bool token_ids = false;
  std::string model;  // the id answers carry
};

// Rewrites one worker chunk for the client and records the progress; empty
// when nothing is to be sent (a second role chunk, an unasked usage chunk).
std::string relay_chunk(json c, const ClientAsk& ask, StreamProgress& p) {
  if (p.id.is_null()) {
    p.id = c.value("id", json(nullptr));
    p.created = c.value("created", json(nullptr));
  }
  c["id"] = p.id;
  c["created"] = p.created;
  c["model"] = ask.model;
  auto choices = c.find("choices");
  if (choices == c.end() || !choices->is_array() || choices->empty()) {
    // The usage chunk: counts across every worker the stream went through.
    if (!ask.include_usage || p.usage_sent) return "";
    const int prompt = p.prompt_ids ? static_cast<int>(p.prompt_ids->size()) : 0;
    const int completion = static_cast<int>(p.generated.size());
    c["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
    p.usage_sent = true;
    return "data: " + dump(c) + "\n\n";
  }
  json& ch = (*choices)[0];
  if (auto it = ch.find("prompt_token_ids"); it != ch.end()) {
    if (!p.prompt_ids && it->is_array()) p.prompt_ids = it->get<std::vector<int>>();
    if (!ask.token_ids) ch.erase("prompt_token_ids");
  }
  if (auto it = ch.find("token_ids"); it != ch.end()) {
    if (it->is_array())
      for (const json& t : *it)
        if (t.is_number_integer()) p.generated.push_back(t.get<int>());
    if (!ask.token_ids) ch.erase("token_ids");
  }
  if (!ask.include_usage) c.erase("usage");
  if (ask.chat) {
    if (auto d = ch.find("delta"); d != ch.end() && d->is_object()) {
      if (d->contains("role")) {
        if (p.role_sent) return "";
        p.role_sent = true;
      }
      if (auto t = d->find("content"); t != d->end() && t->is_string()) p.sent_bytes += t->get_ref<const std::string&>().size();
    }
  } else if (auto t = ch.find("text"); t != ch.end() && t->is_string()) {
    p.sent_bytes += t->get_ref<const std::string&>().size();
  }
  if (auto f = ch.find("finish_reason"); f != ch.end() && f->is_string()) p.finish_reason = f->get<std::string>();
  return "data: " + dump(c) + "\n\n";
}

}  // namespace

Router::Router(const RouterOptions& opts, obs::Registry& registry)
    : opts_(opts), registry_(registry), state_(std::make_shared<State>(opts, registry)) {
  State& s = *state_;
  for (size_t t = 0; t < opts.tiers.size(); t++) {
    const RouteTier& tier = opts.tiers[t];
    s.tier_names.push_back(tier.name);
    s.tier_active.push_back(&registry.gauge("tessera_route_tier_active",
                                            "1 for the tier requests go to now, 0 for the others", {{"tier", tier.name}}));
    s.latency.push_back(&registry.histogram("tessera_route_request_duration_seconds",
                                            "Request latency at the router, by the tier that answered",
                                            obs::exponential_buckets(0.01, 2, 14), {{"tier", tier.name}}));
    for (const std::string& url : tier.urls) {
      auto w = std::make_unique<Worker>();
      w->url = url;
      w->addr = parse_url(url).value();
      w->tier = t;
      w->tier_name = tier.name;
      w->up_gauge = &registry.gauge("tessera_route_worker_up", "1 while the router sends the worker requests",
                                    {{"tier", tier.name}, {"worker", url}});
      s.workers.push_back(std::move(w));
    }
  }
  s.retries = &registry.counter("tessera_route_retries_total",
                                "Attempts after the first: a request sent again, or a stream continued, elsewhere");
  s.inflight_gauge = &registry.gauge("tessera_route_requests_running", "Requests in flight at the router");
  for (int code : {200, 429, 503}) s.requests(code);
}

Router::~Router() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->changed.notify_all();
  state_->stopping.notify_all();
  for (auto& w : state_->workers)
    if (w->health.joinable()) w->health.join();
  if (http_) {
    http_->stop();
    http_->wait();  // the request threads use the state
  }
}

Status Router::start() {
  State& s = *state_;
  if (s.workers.empty()) return Status::InvalidArgument("no workers: give at least one --tier NAME=URL");
  // The TLS files first: one line before any worker is asked.
  ASSIGN_OR_RETURN(http_, HttpServer::make(opts_.tls));
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--tls-worker-ca", opts_.worker_ca},
                                   {"--tls-worker-cert", opts_.worker_cert},
                                   {"--tls-worker-key", opts_.worker_key}}) {
    if (path.empty()) continue;
    if (Status st = io::check_regular_file(path); !st.ok())
      return Status::InvalidArgument(fmt::format("{} {}", flag, st.message()));
  }
  if (opts_.worker_cert.empty() != opts_.worker_key.empty())
    return Status::InvalidArgument("--tls-worker-cert and --tls-worker-key go together");
  for (auto& w : s.workers) s.check(*w);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.update_active_locked("recovered", "first health check");
  }
  for (auto& w : s.workers) w->health = std::thread([&s, p = w.get()] { s.health_loop(*p); });

  std::shared_ptr<State> st = state_;
  httplib::Server& http = http_->routes();
  HttpOptions ho;
  ho.threads = std::clamp(opts_.max_inflight + 8, 8, 1024);
  ho.max_body_bytes = opts_.max_body_bytes;
  ho.door = opts_.door;
  configure_http(http, ho, [st](httplib::Response& res, const ApiError& e) { st->send_error(res, e); });

  http.Get("/health", [st](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(st->mu);
    json tiers = json::array();
    for (size_t t = 0; t < st->tier_names.size(); t++) {
      json ws = json::array();
      for (const auto& w : st->workers) {
        if (w->tier != t) continue;
        ws.push_back({{"url", w->url}, {"up", w->up}, {"reason", w->reason}, {"requests_running", w->inflight},
                      {"model", w->served_model}});
      }
      tiers.push_back({{"name", st->tier_names[t]}, {"active", static_cast<int>(t) == st->active}, {"workers", ws}});
    }
    const bool ok = st->active >= 0 && !st->draining;
    json j = {{"status", st->draining ? "draining" : ok ? "ok" : "unavailable"},
              {"active_tier", st->active >= 0 ? json(st->tier_names[st->active]) : json(nullptr)},
              {"reason", st->active_reason},
              {"requests_running", st->inflight},
              {"tiers", tiers}};
    res.status = ok ? 200 : 503;
    res.set_content(dump(j), "application/json");
  });
  http.Get("/metrics", [st](const httplib::Request&, httplib::Response& res) {
    res.set_content(st->reg.render_prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });

  auto authorized = [st](const httplib::Request& req, httplib::Response& res) {
    if (st->opts.api_key.empty()) return true;
    const std::string want = "Bearer " + st->opts.api_key;
    const std::string got = req.get_header_value("Authorization");
    unsigned diff = got.size() != want.size();
    for (size_t i = 0; i < want.size(); i++) diff |= static_cast<unsigned>(want[i] ^ (i < got.size() ? got[i] : 0));
    if (diff == 0) return true;
    st->send_error(res, api_error(401,
                                  got.empty() ? "no API key: send the header 'Authorization: Bearer KEY'"
                                              : "the API key is wrong",
                                  "invalid_request_error", "", "invalid_api_key"));
    return false;
  };
  http.Get("/v1/models", [st, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    json m = {{"id", st->model_name()}, {"object", "model"}, {"owned_by", "tessera"}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });

  auto complete = [st, authorized](const httplib::Request& req, httplib::Response& res, bool chat) {
    State& s = *st;
    const Clock::time_point t0 = Clock::now();
    if (!authorized(req, res)) return;
    if (s.draining) {
      s.send_error(res, api_error(503, "the router is shutting down", "service_unavailable"));
      return;
    }
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      s.send_error(res, api_error(400, "the body is not valid JSON"));
      return;
    }
    if (!body.is_object()) {
      s.send_error(res, api_error(400, "the body must be a JSON object"));
      return;
    }
    const std::string model = s.model_name();
    if (auto m = body.find("model"); m != body.end() && !m->is_null() && !(m->is_string() && *m == model)) {
      s.send_error(res, api_error(404,
                                  fmt::format("the model '{}' does not exist; this router serves '{}'",
                                              m->is_string() ? m->get<std::string>() : m->dump(), model),
                                  "invalid_request_error", "model", "model_not_found"));
      return;
    }
    for (const char* f : {"stream", "return_token_ids"}) {
      if (auto it = body.find(f); it != body.end() && !it->is_null() && !it->is_boolean()) {
        s.send_error(res, api_error(400, fmt::format("'{}' must be a boolean", f), "invalid_request_error", f));
        return;
      }
    }
    if (body.contains("resume")) {
      s.send_error(res, api_error(400, "'resume' is for the router's own use", "invalid_request_error", "resume"));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.inflight >= s.opts.max_inflight) {
        s.send_error(res, api_error(429, fmt::format("{} requests are in flight (--max-inflight)", s.inflight),
                                    "rate_limit_error", "", "queue_full"));
        return;
      }
      s.inflight++;
      s.inflight_gauge->set(s.inflight);
    }
    std::shared_ptr<bool> counted = std::shared_ptr<bool>(new bool(true), [st](bool* b) {
      delete b;
      std::lock_guard<std::mutex> lock(st->mu);
      st->inflight--;
      st->inflight_gauge->set(st->inflight);
      st->idle.notify_all();
    });
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const bool stream = flag_at(body, "stream");
    auto served = [&](Worker& w) {
      std::lock_guard<std::mutex> lock(s.mu);
      return w.served_model;
    };
    auto observe = [&s, t0](Worker& w) { s.latency[w.tier]->observe(seconds_since(t0)); };

    if (!stream) {
      // Sent again, from the start, to the next worker while one fails.
      std::set<Worker*> full;
      std::optional<Outcome> busy;
      std::string last_failure = "no worker is up";
      for (int attempt = 0; attempt < s.opts.max_attempts; attempt++) {
        Worker* w = s.pick(full);
        if (!w) break;
        if (attempt > 0) s.retries->add(1);
        json up = body;
        if (const std::string m = served(*w); !m.empty()) up["model"] = m;
        Outcome o = s.send(*w, path, up, nullptr);
        if (o.kind == Outcome::kAborted) {
          last_failure = fmt::format("worker {} was taken out", w->url);
          continue;
        }
        if (o.kind == Outcome::kFailed) {
          s.take_out(*w, o.label, o.reason);
          last_failure = o.reason;
          continue;
        }
        if (o.status == 200) {
          json j = json::parse(o.body, nullptr, false);
          if (!j.is_object()) {
            s.take_out(*w, "http_5xx", "an answer that is not JSON");
            continue;
          }
          j["model"] = model;
          res.set_header("X-Tessera-Tier", w->tier_name);
          res.set_content(dump(j), "application/json");
          s.requests(200).add(1);
          s.succeeded(*w);
          observe(*w);
          return;
        }
        if (o.status == 429) {
          full.insert(w);
          busy = std::move(o);
          continue;
        }
        if (o.status >= 500) {
          auto [label, reason] = failure_of(o.status, o.body);
          s.take_out(*w, label, reason);
          last_failure = reason;
          continue;
        }
        // The client's error: passed through.
        res.status = o.status;
        res.set_content(o.body, "application/json");
        s.requests(o.status).add(1);
        return;
      }
      if (busy) {
        res.status = 429;
        res.set_header("Retry-After", "1");
        res.set_content(busy->body, "application/json");
        s.requests(429).add(1);
        return;
      }
      s.send_error(res, api_error(503, fmt::format("no worker could serve the request: {}", last_failure),
                                  "service_unavailable"));
      return;
    }

    // Streamed: a thread relays the workers' streams (router.h).
    auto relay = std::make_shared<Relay>();
    ClientAsk ask;
    ask.chat = chat;
    ask.model = model;
    ask.token_ids = flag_at(body, "return_token_ids");
    if (auto so = body.find("stream_options"); so != body.end() && so->is_object())
      ask.include_usage = flag_at(*so, "include_usage");
    std::thread([st, relay, ask, body, path, t0, counted]() mutable {
      State& s = *st;
      StreamProgress p;
      std::set<Worker*> full;
      std::optional<Outcome> busy;
      std::string last_failure = "no worker is up";
      SseReader sse;
      auto finish_stream = [&](Worker* w) {
        // A stream whose end reached us but not its [DONE]: completed here.
        if (!p.usage_sent && ask.include_usage) {
          const json c = {{"id", p.id},
                          {"object", ask.chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", p.created},
                          {"choices", json::array()}};
          relay->emit(relay_chunk(c, ask, p));
        }
        relay->emit("data: [DONE]\n\n", true);
        s.requests(200).add(1);
        if (w) s.latency[w->tier]->observe(seconds_since(t0));
      };
      for (int attempt = 0; attempt < s.opts.max_attempts && !relay->client_gone; attempt++) {
        Worker* w = s.pick(full);
        if (!w) break;
        if (attempt > 0) s.retries->add(1);
        json up = body;
        {
          std::lock_guard<std::mutex> lock(s.mu);
          if (!w->served_model.empty()) up["model"] = w->served_model;
        }
        {
          std::lock_guard<std::mutex> lock(relay->mu);
          relay->tier = w->tier_name;
        }
        up["stream"] = true;
        up["stream_options"] = {{"include_usage", true}};
        up["return_token_ids"] = true;
        if (p.prompt_ids && !p.generated.empty()) {
          // Continue where the last worker stopped.
          std::vector<int> ids = *p.prompt_ids;
          ids.insert(ids.end(), p.generated.begin(), p.generated.end());
          up["resume"] = {{"token_ids", ids}, {"generated", p.generated.size()}, {"sent_bytes", p.sent_bytes}};
          const char* key = body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
          std::optional<int64_t> max_tokens;
          if (auto m = body.find(key); m != body.end() && m->is_number_integer()) max_tokens = m->get<int64_t>();
          if (!max_tokens && !ask.chat) max_tokens = kCompletionsDefaultMaxTokens;
          if (max_tokens) {
            const int64_t left = *max_tokens - static_cast<int64_t>(p.generated.size());
            if (left <= 0) {
              // Every token was generated; only the end was lost.
              std::lock_guard<std::mutex> lock(s.mu);
              w->inflight--;
              p.finish_reason = "length";
              break;
            }
            up[key] = left;
          }
        }
        bool error_event = false;
        std::string error_message;
        Outcome o = s.send(
            *w, path, up,
            [&](const char* d, size_t n) {
              if (relay->client_gone) return false;
              return sse.feed(d, n, [&](std::string_view payload) {
                if (payload == "[DONE]") {
                  p.done = true;
                  return true;
                }
                json c = json::parse(payload, nullptr, false);
                if (!c.is_object()) {
                  error_event = true;
                  error_message = "an unparsable chunk";
                  return false;
                }
                if (c.contains("error")) {
                  error_event = true;
                  error_message = string_at(c["error"], "message");
                  return false;
                }
                if (std::string b = relay_chunk(std::move(c), ask, p); !b.empty()) relay->emit(std::move(b));
                return true;
              });
            });
        sse = SseReader();
        if (relay->client_gone) break;
        if (p.done) {
          relay->emit("data: [DONE]\n\n", true);
          s.requests(200).add(1);
          s.succeeded(*w);
          s.latency[w->tier]->observe(seconds_since(t0));
          return;
        }
        if (o.kind == Outcome::kAnswered && o.status != 200) {
          if (o.status == 429) {
            full.insert(w);
            busy = std::move(o);
            continue;
          }
          if (o.status < 500) {
            // The client's error (a continuation refused is the router's).
            if (p.role_sent || p.sent_bytes > 0) {
              relay->emit("data: " + o.body + "\n\ndata: [DONE]\n\n", true);
            } else {
              relay->answer_with(o.status, o.body);
            }
            s.requests(o.status).add(1);
            return;
          }
          auto [label, reason] = failure_of(o.status, o.body);
          s.take_out(*w, label, reason);
          last_failure = reason;
          continue;
        }
        if (p.finish_reason) {
          finish_stream(w);
          return;
        }
        // Failed mid-stream (or before it): take the worker out and go on.
        if (o.kind == Outcome::kAborted) {
          last_failure = fmt::format("worker {} was taken out", w->url);
        } else if (error_event) {
          auto [label, reason] = failure_of(500, json{{"error", {{"message", error_message}}}}.dump());
          s.take_out(*w, label, "a stream ended with an error: " + reason);
          last_failure = reason;
        } else {
          const std::string reason = o.kind == Outcome::kFailed ? o.reason : "a stream ended without [DONE]";
          s.take_out(*w, o.kind == Outcome::kFailed ? o.label : "http_5xx", reason);
          last_failure = reason;
        }
      }
      if (relay->client_gone) return;
      if (p.finish_reason) {
        // Everything was generated; the end is written here.
        json c = {{"id", p.id}, {"created", p.created}, {"object", ask.chat ? "chat.completion.chunk" : "text_completion"},
                  {"choices", json::array({{{"index", 0}, {"finish_reason", *p.finish_reason}, {"logprobs", nullptr}}})}};
        if (ask.chat) c["choices"][0]["delta"] = json::object();
        else c["choices"][0]["text"] = "";
        if (!p.done) relay->emit(relay_chunk(c, ask, p));
        finish_stream(nullptr);
        return;
      }
      ApiError e = busy ? api_error(429, "every worker is busy", "rate_limit_error", "", "queue_full")
                        : api_error(503, fmt::format("no worker could serve the request: {}", last_failure),
                                    "service_unavailable");
      std::lock_guard<std::mutex> lock(relay->mu);
      const bool streaming = relay->phase == Relay::kStreaming;
      if (streaming) {
        relay->out += "data: " + dump(e.body()) + "\n\ndata: [DONE]\n\n";
        relay->finished = true;
      } else {
        relay->phase = Relay::kAnswered;
        relay->status = e.http;
        relay->answer = busy ? busy->body : dump(e.body());
      }
      s.requests(e.http).add(1);
      relay->cv.notify_all();
    }).detach();

    {
      std::unique_lock<std::mutex> lock(relay->mu);
      relay->cv.wait(lock, [&] { return relay->phase != Relay::kPending; });
      if (relay->phase == Relay::kAnswered) {
        res.status = relay->status;
        if (relay->status == 429 || relay->status == 503) res.set_header("Retry-After", "1");
        res.set_content(relay->answer, "application/json");
        return;
      }
      res.set_header("X-Tessera-Tier", relay->tier);  // where the stream began
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [relay, counted](size_t, httplib::DataSink& sink) {
          std::string out;
          bool finished;
          {
            std::unique_lock<std::mutex> lock(relay->mu);
            relay->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return !relay->out.empty() || relay->finished; });
            out.swap(relay->out);
            finished = relay->finished;
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;
          if (finished) sink.done();
          return true;
        },
        [relay](bool success) {
          // The client went away: the worker's request ends at its next chunk.
          if (!success) relay->client_gone = true;
        });
  };
  http.Post("/v1/completions", [complete](const httplib::Request& req, httplib::Response& res) { complete(req, res, false); });
  http.Post("/v1/chat/completions",
            [complete](const httplib::Request& req, httplib::Response& res) { complete(req, res, true); });

  ASSIGN_OR_RETURN(port_, http_->bind(opts_.host, opts_.port));
  return http_->start(ho, &registry_);
}

bool Router::shutdown() {
  State& s = *state_;
  s.draining = true;
  bool drained;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    drained = s.idle.wait_for(lock, std::chrono::duration<double>(opts_.drain_timeout_s), [&] { return s.inflight == 0; });
  }
  if (http_) http_->stop();
  return drained;
}

void Router::wait() {
  if (http_) http_->wait();
}

}  // namespace tessera::serve

#include "serve/router.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "serve/http.h"

namespace tessera::serve {

using json = nlohmann::json;
using route::Clock;
using route::Outcome;
using route::RetryPolicy;
using route::Worker;

namespace {

constexpr int kCompletionsDefaultMaxTokens = 16;  // OpenAI's, and tessera serve's

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

route::PoolOptions pool_options(const RouterOptions& o) {
  route::PoolOptions p;
  p.health_timeout_s = o.health_timeout_s;
  p.health_failures = o.health_failures;
  p.hold_down_s = o.hold_down_s;
  p.connect_timeout_s = o.connect_timeout_s;
  p.stall_timeout_s = o.stall_timeout_s;
  p.wait_for_worker_s = o.wait_for_worker_s;
  p.worker_api_key = o.worker_api_key;
  p.worker_ca = o.worker_ca;
  p.worker_cert = o.worker_cert;
  p.worker_key = o.worker_key;
  return p;
}

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
    if (Result<route::Address> a = route::parse_url(u); !a.ok()) return a.status();
    t.urls.push_back(u);
    start = comma + 1;
  }
  return t;
}

namespace {

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

struct Router::State {
  RouterOptions opts;
  obs::Registry& reg;
  route::WorkerPool pool;
  route::OwnedThreads relays;  // one per streamed request, joined at shutdown

  InFlight inflight;  // requests; --max-inflight bounds it, shutdown drains it
  std::atomic<bool> draining{false};

  std::vector<obs::Histogram*> latency;

  State(const RouterOptions& o, obs::Registry& r) : opts(o), reg(r), pool(o.tiers, pool_options(o), r) {}

  obs::Counter& requests(int code) {
    return reg.counter("tessera_route_requests_total", "Requests answered by the router, by HTTP status",
                       {{"code", std::to_string(code)}});
  }

  void send_error(httplib::Response& res, const ApiError& e) {
    write_error(res, e);
    requests(e.http).add(1);
  }

  std::string model_name() {
    if (!opts.model_name.empty()) return opts.model_name;
    const std::string m = pool.any_served_model();
    return m.empty() ? "model" : m;
  }

  // The request for worker w: its own model name.
  json for_worker(Worker& w, const json& body) {
    json up = body;
    if (const std::string m = pool.served_model(w); !m.empty()) up["model"] = m;
    return up;
  }

  void answered(Worker& w, Clock::time_point t0) {
    requests(200).add(1);
    latency[w.tier]->observe(seconds_since(t0));
  }

  // Not streamed: the request again, from the start, at the next worker
  // while one fails (route_policy.h).
  void complete(const json& body, const std::string& path, const std::string& model, Clock::time_point t0,
                httplib::Response& res) {
    RetryPolicy policy(pool, opts.max_attempts);
    while (Worker* w = policy.next()) {
      Outcome o = pool.send(*w, path, dump(for_worker(*w, body)), nullptr);
      json j;
      if (o.kind == Outcome::kAnswered && o.status == 200) {
        j = json::parse(o.body, nullptr, false);
        if (!j.is_object()) o = Outcome{Outcome::kFailed, 200, "", "an answer that is not JSON", "http_5xx"};
      }
      switch (policy.judge(*w, o)) {
        case RetryPolicy::Action::kRetry: continue;
        case RetryPolicy::Action::kDeliver:
          j["model"] = model;
          res.set_header("X-Tessera-Tier", w->tier_name);
          res.set_content(dump(j), "application/json");
          answered(*w, t0);
          return;
        case RetryPolicy::Action::kPassThrough:
          res.status = o.status;
          res.set_content(o.body, "application/json");
          requests(o.status).add(1);
          return;
      }
    }
    const ApiError e = policy.give_up();
    if (policy.busy_body()) {
      write_error(res, e);
      res.set_content(*policy.busy_body(), "application/json");  // the worker's own 429
      requests(429).add(1);
      return;
    }
    send_error(res, e);
  }

  void stream(const json& body, const std::string& path, const ClientAsk& ask, Clock::time_point t0,
              const std::shared_ptr<Relay>& relay);
};

// Streamed: the workers' streams relayed as one (router.h). Runs on its own
// thread (State::relays); the client's HTTP thread writes what it emits.
void Router::State::stream(const json& body, const std::string& path, const ClientAsk& ask, Clock::time_point t0,
                           const std::shared_ptr<Relay>& relay) {
  StreamProgress p;
  RetryPolicy policy(pool, opts.max_attempts);
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
    requests(200).add(1);
    if (w) latency[w->tier]->observe(seconds_since(t0));
  };
  while (!relay->client_gone) {
    Worker* w = policy.next();
    if (!w) break;
    json up = for_worker(*w, body);
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
          pool.unpick(*w);
          p.finish_reason = "length";
          break;
        }
        up[key] = left;
      }
    }
    std::optional<std::string> error_event;  // an error chunk's message
    Outcome o = pool.send(*w, path, dump(up), [&](const char* d, size_t n) {
      if (relay->client_gone) return false;
      return sse.feed(d, n, [&](std::string_view payload) {
        if (payload == "[DONE]") {
          p.done = true;
          return true;
        }
        json c = json::parse(payload, nullptr, false);
        if (!c.is_object()) {
          error_event = "an unparsable chunk";
          return false;
        }
        if (c.contains("error")) {
          error_event = string_at(c["error"], "message");
          return false;
        }
        if (std::string b = relay_chunk(std::move(c), ask, p); !b.empty()) relay->emit(std::move(b));
        return true;
      });
    });
    sse = SseReader();
    if (relay->client_gone) break;
    if (p.done) {
      policy.judge(*w, Outcome{Outcome::kAnswered, 200, "", "", ""});
      relay->emit("data: [DONE]\n\n", true);
      answered(*w, t0);
      return;
    }
    const bool refused = o.kind == Outcome::kAnswered && o.status != 200;
    if (!refused && p.finish_reason) {
      // Every token arrived; only the stream's end was lost.
      finish_stream(w);
      return;
    }
    if (o.kind == Outcome::kAnswered && o.status == 200) {
      // A 200 whose stream broke off: the worker's failure.
      if (error_event) {
        auto [label, reason] = route::failure_of(500, json{{"error", {{"message", *error_event}}}}.dump());
        o = Outcome{Outcome::kFailed, 200, "", "a stream ended with an error: " + reason, label};
      } else {
        o = Outcome{Outcome::kFailed, 200, "", "a stream ended without [DONE]", "http_5xx"};
      }
    }
    switch (policy.judge(*w, o)) {
      case RetryPolicy::Action::kRetry: continue;
      case RetryPolicy::Action::kDeliver: continue;  // not reached: a 200 is handled above
      case RetryPolicy::Action::kPassThrough:
        // The client's error (a continuation refused is the router's).
        if (p.role_sent || p.sent_bytes > 0) {
          relay->emit("data: " + o.body + "\n\ndata: [DONE]\n\n", true);
        } else {
          relay->answer_with(o.status, o.body);
        }
        requests(o.status).add(1);
        return;
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
  const ApiError e = policy.give_up();
  std::lock_guard<std::mutex> lock(relay->mu);
  if (relay->phase == Relay::kStreaming) {
    relay->out += "data: " + dump(e.body()) + "\n\ndata: [DONE]\n\n";
    relay->finished = true;
  } else {
    relay->phase = Relay::kAnswered;
    relay->status = e.http;
    relay->answer = policy.busy_body() ? *policy.busy_body() : dump(e.body());
  }
  requests(e.http).add(1);
  relay->cv.notify_all();
}

Router::Router(const RouterOptions& opts, obs::Registry& registry)
    : opts_(opts), registry_(registry), state_(std::make_shared<State>(opts, registry)) {
  State& s = *state_;
  for (const RouteTier& tier : opts.tiers)
    s.latency.push_back(&registry.histogram("tessera_route_request_duration_seconds",
                                            "Request latency at the router, by the tier that answered",
                                            obs::exponential_buckets(0.01, 2, 14), {{"tier", tier.name}}));
  obs::Gauge* running = &registry.gauge("tessera_route_requests_running", "Requests in flight at the router");
  s.inflight.on_change([running](int n) { running->set(n); });
  for (int code : {200, 429, 503}) s.requests(code);
}

Router::~Router() {
  // The workers first (no new attempt starts; those in flight end), then
  // the HTTP threads, then the relays they fed.
  state_->pool.stop();
  if (http_) {
    http_->stop();
    http_->wait();
  }
  state_->relays.join_all();
}

Status Router::start() {
  State& s = *state_;
  if (s.pool.workers().empty()) return Status::InvalidArgument("no workers: give at least one --tier NAME=URL");
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
  s.pool.start_health(opts_.health_interval_s);

  std::shared_ptr<State> st = state_;
  httplib::Server& http = http_->routes();
  HttpOptions ho;
  ho.threads = std::clamp(opts_.max_inflight + 8, 8, 1024);
  ho.max_body_bytes = opts_.max_body_bytes;
  ho.door = opts_.door;
  configure_http(http, ho, [st](httplib::Response& res, const ApiError& e) { st->send_error(res, e); });

  http.Get("/health", [st](const httplib::Request&, httplib::Response& res) {
    route::WorkerPool& pool = st->pool;
    const std::vector<route::WorkerView> workers = pool.view();
    const int active = pool.active_tier();
    json tiers = json::array();
    for (size_t t = 0; t < pool.tier_names().size(); t++) {
      json ws = json::array();
      for (const route::WorkerView& w : workers) {
        if (w.tier_index != t) continue;
        ws.push_back({{"url", w.url}, {"up", w.up}, {"reason", w.reason}, {"requests_running", w.inflight},
                      {"model", w.model}});
      }
      tiers.push_back({{"name", pool.tier_names()[t]}, {"active", static_cast<int>(t) == active}, {"workers", ws}});
    }
    const int inflight = st->inflight.count();
    const bool draining = st->draining;
    const bool ok = active >= 0 && !draining;
    json j = {{"status", draining ? "draining" : ok ? "ok" : "unavailable"},
              {"active_tier", active >= 0 ? json(pool.tier_names()[active]) : json(nullptr)},
              {"reason", pool.active_reason()},
              {"requests_running", inflight},
              {"tiers", tiers}};
    res.status = ok ? 200 : 503;
    res.set_content(dump(j), "application/json");
  });
  http.Get("/metrics", [st](const httplib::Request&, httplib::Response& res) {
    res.set_content(st->reg.render_prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });

  auto authorized = [st](const httplib::Request& req, httplib::Response& res) {
    std::optional<ApiError> refused = check_api_key(st->opts.api_key, req.get_header_value("Authorization"));
    if (refused) st->send_error(res, *refused);
    return !refused;
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
    std::shared_ptr<void> counted = s.inflight.enter(s.opts.max_inflight);
    if (!counted) {
      s.send_error(res, api_error(429, fmt::format("{} requests are in flight (--max-inflight)", s.inflight.count()),
                                  "rate_limit_error", "", "queue_full"));
      return;
    }
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const bool stream = flag_at(body, "stream");
    if (!stream) {
      s.complete(body, path, model, t0, res);
      return;
    }

    // Streamed: a thread of the router's relays the workers' streams.
    auto relay = std::make_shared<Relay>();
    ClientAsk ask;
    ask.chat = chat;
    ask.model = model;
    ask.token_ids = flag_at(body, "return_token_ids");
    if (auto so = body.find("stream_options"); so != body.end() && so->is_object())
      ask.include_usage = flag_at(*so, "include_usage");
    s.relays.spawn([st, relay, ask, body = std::move(body), path, t0, counted] {
      st->stream(body, path, ask, t0, relay);
    });

    {
      std::unique_lock<std::mutex> lock(relay->mu);
      relay->cv.wait(lock, [&] { return relay->phase != Relay::kPending; });
      if (relay->phase == Relay::kAnswered) {
        res.status = relay->status;
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
  const bool drained = s.inflight.wait_idle(opts_.drain_timeout_s);
  if (http_) http_->stop();
  return drained;
}

void Router::wait() {
  if (http_) http_->wait();
}

}  // namespace tessera::serve

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
  std::string tier;                      // of the worker being tried
  std::string began_tier;                // of the worker whose chunk came first (X-Tessera-Tier)

  void emit(std::string bytes, bool last = false) {
    std::lock_guard<std::mutex> lock(mu);
    // The client's HTTP thread may wake after later attempts have begun.
    if (phase != kStreaming) began_tier = tier;
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

// One request's exchange with the workers, in one of the two modes (router.h,
// "Retries"). The one attempt loop, State::relay, drives it: a worker from the
// retry policy, the body request() makes for it, the outcome settle() makes
// of what came back, the policy's judgement of that; then deliver() or
// pass_through(), or once the attempts are used up finish() (an answer that
// is whole anyway) or give_up().
class Exchange {
 public:
  virtual ~Exchange() = default;
  // The client went away: no more attempts, nothing more to write.
  virtual bool gone() const { return false; }
  // The body for worker w (up: the client's request under w's model name);
  // nullopt when nothing is left to ask of any worker.
  virtual std::optional<json> request(Worker& w, json up) = 0;
  // Where a 200's body goes as it arrives; empty: collected in Outcome::body.
  virtual std::function<bool(const char*, size_t)> receiver() { return nullptr; }
  // An attempt's outcome as the policy is to judge it: answered 200 only when
  // the answer is whole.
  virtual Outcome settle(Outcome o) = 0;
  virtual void deliver(Worker& w) = 0;
  virtual void pass_through(const Outcome& o) = 0;
  // After the attempts: whether the answer is whole anyway, and its end
  // written then.
  virtual bool whole() const { return false; }
  virtual void finish() {}
  virtual void give_up(const ApiError& e, const std::optional<std::string>& busy_body) = 0;
};

// Not streamed: the request again, from the start, at the next worker while
// one fails; the client gets the answer under the router's model id.
class BufferedExchange final : public Exchange {
 public:
  BufferedExchange(std::string model, httplib::Response& res) : model_(std::move(model)), res_(res) {}

  std::optional<json> request(Worker&, json up) override { return up; }

  Outcome settle(Outcome o) override {
    if (o.kind == Outcome::kAnswered && o.status == 200) {
      answer_ = json::parse(o.body, nullptr, false);
      if (!answer_.is_object()) return Outcome{Outcome::kFailed, 200, "", "an answer that is not JSON", "http_5xx"};
    }
    return o;
  }

  void deliver(Worker& w) override {
    answer_["model"] = model_;
    res_.set_header("X-Tessera-Tier", w.tier_name);
    res_.set_content(dump(answer_), "application/json");
  }

  void pass_through(const Outcome& o) override {
    res_.status = o.status;
    res_.set_content(o.body, "application/json");
  }

  void give_up(const ApiError& e, const std::optional<std::string>& busy_body) override {
    write_error(res_, e);
    if (busy_body) res_.set_content(*busy_body, "application/json");  // the worker's own 429
  }

 private:
  std::string model_;
  httplib::Response& res_;
  json answer_;
};

// Streamed: the workers' streams relayed as one (router.h). Every worker is
// asked for a stream with its token ids; the next one continues where the
// last stopped ("resume"). Runs on a thread of its own (State::relays); the
// client's HTTP thread writes what it emits.
class StreamedExchange final : public Exchange {
 public:
  StreamedExchange(const json& body, const ClientAsk& ask, std::shared_ptr<Relay> relay)
      : body_(body), ask_(ask), relay_(std::move(relay)) {}

  bool gone() const override { return relay_->client_gone; }

  std::optional<json> request(Worker& w, json up) override {
    {
      std::lock_guard<std::mutex> lock(relay_->mu);
      relay_->tier = w.tier_name;
    }
    up["stream"] = true;
    up["stream_options"] = {{"include_usage", true}};
    up["return_token_ids"] = true;
    error_event_.reset();
    if (!p_.prompt_ids || p_.generated.empty()) return up;
    // Continue where the last worker stopped.
    std::vector<int> ids = *p_.prompt_ids;
    ids.insert(ids.end(), p_.generated.begin(), p_.generated.end());
    up["resume"] = {{"token_ids", ids}, {"generated", p_.generated.size()}, {"sent_bytes", p_.sent_bytes}};
    const char* key = body_.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    std::optional<int64_t> max_tokens;
    if (auto m = body_.find(key); m != body_.end() && m->is_number_integer()) max_tokens = m->get<int64_t>();
    if (!max_tokens && !ask_.chat) max_tokens = kCompletionsDefaultMaxTokens;
    if (max_tokens) {
      const int64_t left = *max_tokens - static_cast<int64_t>(p_.generated.size());
      if (left <= 0) {
        // Every token was generated; only the end was lost (finish() writes it).
        p_.finish_reason = "length";
        return std::nullopt;
      }
      up[key] = left;
    }
    return up;
  }

  std::function<bool(const char*, size_t)> receiver() override {
    return [this](const char* d, size_t n) {
      if (relay_->client_gone) return false;
      return sse_.feed(d, n, [&](std::string_view payload) {
        if (payload == "[DONE]") {
          p_.done = true;
          return true;
        }
        json c = json::parse(payload, nullptr, false);
        if (!c.is_object()) {
          error_event_ = "an unparsable chunk";
          return false;
        }
        if (c.contains("error")) {
          error_event_ = string_at(c["error"], "message");
          return false;
        }
        if (std::string b = relay_chunk(std::move(c), ask_, p_); !b.empty()) relay_->emit(std::move(b));
        return true;
      });
    };
  }

  Outcome settle(Outcome o) override {
    sse_ = SseReader();
    const Outcome whole{Outcome::kAnswered, 200, "", "", ""};
    if (p_.done) return whole;
    const bool refused = o.kind == Outcome::kAnswered && o.status != 200;
    if (!refused && p_.finish_reason) return whole;  // every token arrived; only the stream's end was lost
    if (o.kind == Outcome::kAnswered && o.status == 200) {
      // A 200 whose stream broke off: the worker's failure.
      if (error_event_) {
        auto [label, reason] = route::failure_of(500, json{{"error", {{"message", *error_event_}}}}.dump());
        return Outcome{Outcome::kFailed, 200, "", "a stream ended with an error: " + reason, label};
      }
      return Outcome{Outcome::kFailed, 200, "", "a stream ended without [DONE]", "http_5xx"};
    }
    return o;
  }

  void deliver(Worker&) override {
    if (p_.done) {
      relay_->emit("data: [DONE]\n\n", true);
      return;
    }
    end();
  }

  void pass_through(const Outcome& o) override {
    // The client's error (a continuation refused is the router's).
    if (p_.role_sent || p_.sent_bytes > 0) {
      relay_->emit("data: " + o.body + "\n\ndata: [DONE]\n\n", true);
    } else {
      relay_->answer_with(o.status, o.body);
    }
  }

  bool whole() const override { return p_.finish_reason.has_value(); }

  void finish() override {
    // Everything was generated; the end is written here.
    json c = {{"id", p_.id},
              {"created", p_.created},
              {"object", ask_.chat ? "chat.completion.chunk" : "text_completion"},
              {"choices", json::array({{{"index", 0}, {"finish_reason", *p_.finish_reason}, {"logprobs", nullptr}}})}};
    if (ask_.chat) c["choices"][0]["delta"] = json::object();
    else c["choices"][0]["text"] = "";
    if (!p_.done) relay_->emit(relay_chunk(c, ask_, p_));
    end();
  }

  void give_up(const ApiError& e, const std::optional<std::string>& busy_body) override {
    std::lock_guard<std::mutex> lock(relay_->mu);
    if (relay_->phase == Relay::kStreaming) {
      relay_->out += "data: " + dump(e.body()) + "\n\ndata: [DONE]\n\n";
      relay_->finished = true;
    } else {
      relay_->phase = Relay::kAnswered;
      relay_->status = e.http;
      relay_->answer = busy_body ? *busy_body : dump(e.body());
    }
    relay_->cv.notify_all();
  }

 private:
  // A stream whose end reached us but not its [DONE]: completed here.
  void end() {
    if (!p_.usage_sent && ask_.include_usage) {
      const json c = {{"id", p_.id},
                      {"object", ask_.chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", p_.created},
                      {"choices", json::array()}};
      relay_->emit(relay_chunk(c, ask_, p_));
    }
    relay_->emit("data: [DONE]\n\n", true);
  }

  const json& body_;
  const ClientAsk ask_;
  std::shared_ptr<Relay> relay_;
  StreamProgress p_;
  SseReader sse_;
  std::optional<std::string> error_event_;  // the current attempt's error chunk
};

}  // namespace

struct Router::State {
  RouterOptions opts;
  obs::Registry& reg;
  route::WorkerPool pool;
  route::OwnedThreads relays;  // one per streamed request, joined at shutdown

  InFlight inflight;  // requests; --max-inflight bounds it, shutdown drains it
  std::atomic<bool> draining{false};

  std::vector<obs::Histogram*> latency;

  State(const RouterOptions& o, obs::Registry& r) : opts(o), reg(r), pool(o.tiers, o.workers, r) {}

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

  // The one attempt loop of both modes (Exchange). Every answer is counted
  // before it is written, so a client that has it sees it in /metrics.
  void relay(const json& body, const std::string& path, Clock::time_point t0, Exchange& x) {
    RetryPolicy policy(pool, opts.max_attempts);
    while (!x.gone()) {
      Worker* w = policy.next();
      if (!w) break;
      json up = body;
      if (const std::string m = pool.served_model(*w); !m.empty()) up["model"] = m;
      std::optional<json> ask = x.request(*w, std::move(up));
      if (!ask) {
        pool.unpick(*w);  // nothing is left to ask
        break;
      }
      const Outcome o = x.settle(pool.send(*w, path, dump(*ask), x.receiver()));
      if (x.gone()) return;
      switch (policy.judge(*w, o)) {
        case RetryPolicy::Action::kRetry: continue;
        case RetryPolicy::Action::kDeliver:
          requests(200).add(1);
          latency[w->tier]->observe(seconds_since(t0));
          x.deliver(*w);
          return;
        case RetryPolicy::Action::kPassThrough:
          requests(o.status).add(1);
          x.pass_through(o);
          return;
      }
    }
    if (x.gone()) return;
    if (x.whole()) {
      requests(200).add(1);
      x.finish();
      return;
    }
    const ApiError e = policy.give_up();
    requests(e.http).add(1);
    x.give_up(e, policy.busy_body());
  }
};

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
  const route::PoolOptions& wo = opts_.workers;
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--tls-worker-ca", wo.worker_ca},
                                   {"--tls-worker-cert", wo.worker_cert},
                                   {"--tls-worker-key", wo.worker_key}}) {
    if (path.empty()) continue;
    if (Status st = io::check_regular_file(path); !st.ok())
      return Status::InvalidArgument(fmt::format("{} {}", flag, st.message()));
  }
  if (wo.worker_cert.empty() != wo.worker_key.empty())
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
      BufferedExchange x(model, res);
      s.relay(body, path, t0, x);
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
      StreamedExchange x(body, ask, relay);
      st->relay(body, path, t0, x);
    });

    {
      std::unique_lock<std::mutex> lock(relay->mu);
      relay->cv.wait(lock, [&] { return relay->phase != Relay::kPending; });
      if (relay->phase == Relay::kAnswered) {
        res.status = relay->status;
        if (relay->status == 429 || relay->status == 503) res.set_header("Retry-After", "1");
        res.set_content(relay->answer, "application/json");
        return;
      }
      res.set_header("X-Tessera-Tier", relay->began_tier);  // where the stream began
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

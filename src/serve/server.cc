#include "serve/server.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <random>

#include <fmt/format.h>
#include <httplib.h>

#include "serve/http.h"

namespace tessera::serve {

using json = nlohmann::json;

namespace {

enum class Phase { kLoading, kReady, kDraining };
enum class Fault { kNone, kHang, kError, kDeviceError };

// What a streamed or waited-on request shares between its HTTP thread and
// the engine's callbacks.
struct Call {
  explicit Call(std::vector<std::string> stops) : text(std::move(stops)) {}
  std::mutex mu;
  std::condition_variable cv;
  TextAssembler text;
  struct Piece {
    std::string text;
    TokenEvent ev;
    bool last = false;  // nothing follows: its chunk carries the finish reason
  };
  std::vector<Piece> pieces;  // one per generated token
  std::string tail;           // text released at the end
  std::string carry;          // a resumed sequence's text not yet sent: goes before the first piece
  size_t skip = 0;            // bytes of text the client already has (resumed): not sent again
  bool admitted = false;

  // Text released by the assembler, less what the client already has.
  std::string unseen(std::string t) {
    const size_t n = std::min(skip, t.size());
    skip -= n;
    return t.substr(n);
  }
  bool done = false;
  RequestResult result;
};

int http_status(const Status& st) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

ApiError error_of(const Status& st) {
  ApiError e;
  e.http = http_status(st);
  e.message = st.message();
  switch (e.http) {
    case 400: e.type = "invalid_request_error"; break;
    case 429: e.type = "rate_limit_error"; e.code = "queue_full"; break;
    case 503: e.type = "service_unavailable"; break;
    default: e.type = "server_error"; break;
  }
  return e;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

class SingleModel : public ModelCatalog {
 public:
  explicit SingleModel(std::shared_ptr<ServedModel> m) : model_(std::move(m)) {}
  Result<std::shared_ptr<ServedModel>> find(const std::string& requested) override {
    if (requested.empty() || requested == model_->id) return model_;
    return Status::NotFound(
        fmt::format("the model '{}' does not exist; this server serves '{}'", requested, model_->id));
  }
  std::vector<std::pair<std::string, std::shared_ptr<ServedModel>>> listed() override { return {{model_->id, model_}}; }
  bool drain(double timeout_s) override { return model_->engine->drain(timeout_s); }

 private:
  std::shared_ptr<ServedModel> model_;
};

}  // namespace

std::shared_ptr<ModelCatalog> single_model_catalog(std::shared_ptr<ServedModel> model) {
  return std::make_shared<SingleModel>(std::move(model));
}

struct Server::Handlers {
  ServerOptions opts;
  obs::Registry& registry;
  std::atomic<Phase> phase{Phase::kLoading};
  std::atomic<Fault> fault{Fault::kNone};  // injected (/admin/fault)
  std::atomic<size_t> fault_after{0};      // kError: tokens a stream sends before failing
  std::shared_ptr<ModelCatalog> catalog;
  std::time_t started = std::time(nullptr);

  std::mutex mu;
  InFlight streams;  // streamed responses still being written
  std::mt19937_64 seeds{std::random_device{}()};
  uint64_t next_id = 1;
  std::string id_prefix;

  obs::Counter& errors(int code) {
    return registry.counter("tessera_request_errors_total", "Requests answered with an error, by HTTP status",
                            {{"code", std::to_string(code)}});
  }
  obs::Counter& successes(std::string_view reason) {
    return registry.counter("tessera_request_success_total", "Requests completed, by finish reason",
                            {{"finish_reason", std::string(reason)}});
  }

  Handlers(const ServerOptions& o, obs::Registry& r) : opts(o), registry(r) {
    id_prefix = fmt::format("{:08x}", static_cast<uint32_t>(seeds()));
    // Series that exist before the first request, so dashboards see zeros.
    for (const char* reason : {"stop", "length"}) successes(reason);
  }

  void send_error(httplib::Response& res, const ApiError& e) {
    write_error(res, e);
    errors(e.http).add(1);
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    std::optional<ApiError> refused = check_api_key(opts.api_key, req.get_header_value("Authorization"));
    if (refused) send_error(res, *refused);
    return !refused;
  }

  // While a hang is injected: waits until it is cleared.
  void hang_while_injected() const {
    while (fault.load() == Fault::kHang) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // The device error of the default model's engine (OK when there is none).
  Status default_engine_fault() {
    auto def = catalog->find("");
    return def.ok() ? (*def)->engine->fault() : Status::OK();
  }

  // 503 while loading or draining or after a device error; 500 while an
  // error is injected; otherwise true.
  bool serving(httplib::Response& res) {
    const Phase p = phase.load();
    if (p == Phase::kReady) {
      if (fault.load() == Fault::kError && fault_after.load() == 0) {
        send_error(res, api_error(500, "internal error (injected fault)", "server_error"));
        return false;
      }
      const Status device = default_engine_fault();
      if (device.ok()) return true;
      send_error(res, error_of(Status::Unavailable(fmt::format("device error: {}", device.message()))));
      return false;
    }
    ApiError e;
    e.http = 503;
    e.type = "service_unavailable";
    e.message = p == Phase::kLoading ? "the model is still loading" : "the server is shutting down";
    send_error(res, e);
    return false;
  }

  void health(httplib::Response& res) {
    const Phase p = phase.load();
    json j;
    // A device error of the default model's engine (serving: the model
    // a request without "model" gets).
    const Status device = p == Phase::kReady ? default_engine_fault() : Status::OK();
    if (!device.ok()) {
      j = {{"status", "device_error"}, {"reason", device.message()}, {"model", opts.model_name}};
      res.status = 503;
    } else if (p == Phase::kReady) {
      const EngineStats s = catalog->find("").value()->engine->stats();
      j = {{"status", "ok"},          {"model", opts.model_name}, {"backend", opts.backend},
           {"running", s.running},    {"waiting", s.waiting},     {"kv_blocks_used", s.kv_used_blocks},
           {"kv_blocks", s.kv_blocks}};
      res.status = 200;
    } else {
      j = {{"status", p == Phase::kLoading ? "loading" : "draining"}, {"model", opts.model_name}};
      res.status = 503;
    }
    res.set_content(dump(j), "application/json");
  }

  // POST /admin/fault {"fault": "none"|"hang"|"error"|"device_error"}, and
  // for "error" optionally "after_tokens": N.
  void inject(const httplib::Request& req, httplib::Response& res) {
    const std::string& a = req.remote_addr;
    if (a != "127.0.0.1" && a != "::1" && a.rfind("::ffff:127.", 0) != 0) {
      send_error(res, api_error(403, "/admin/fault answers loopback clients only", "permission_error"));
      return;
    }
    if (phase.load() != Phase::kReady) {
      serving(res);
      return;
    }
    const json body = json::parse(req.body, nullptr, false);
    const std::string name = body.is_object() && body.contains("fault") && body["fault"].is_string()
                                 ? body["fault"].get<std::string>()
                                 : "";
    Fault f;
    if (name == "none") {
      f = Fault::kNone;
    } else if (name == "hang") {
      f = Fault::kHang;
    } else if (name == "error") {
      f = Fault::kError;
    } else if (name == "device_error") {
      f = Fault::kDeviceError;
    } else {
      send_error(res, api_error(400, "the body must be {\"fault\": \"none\"|\"hang\"|\"error\"|\"device_error\"}",
                                "invalid_request_error", "fault"));
      return;
    }
    size_t after = 0;
    if (auto it = body.is_object() ? body.find("after_tokens") : body.end(); it != body.end()) {
      if (f != Fault::kError || !it->is_number_unsigned()) {
        send_error(res, api_error(400, "'after_tokens' is a number >= 0, for \"error\" only", "invalid_request_error",
                                  "after_tokens"));
        return;
      }
      after = it->get<size_t>();
    }
    fault_after = after;
    fault = f == Fault::kDeviceError ? Fault::kNone : f;
    if (auto def = catalog->find(""); def.ok())
      (*def)->engine->set_fault(f == Fault::kDeviceError ? Status::Internal("injected device error (fault drill)")
                                                         : Status::OK());
    std::fprintf(stderr, "serve: injected fault: %s\n", name.c_str());
    res.set_content(dump(json{{"fault", name}}), "application/json");
  }

  void models(const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res) || !serving(res)) return;
    json data = json::array();
    for (const auto& [id, served] : catalog->listed()) {
      data.push_back({{"id", id},
                      {"object", "model"},
                      {"created", static_cast<int64_t>(started)},
                      {"owned_by", "tessera"},
                      {"max_model_len", served->engine->model().config().context}});
    }
    res.set_content(dump(json{{"object", "list"}, {"data", data}}), "application/json");
  }

  void completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    if (!authorized(req, res) || !serving(res)) return;
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::exception& e) {
      send_error(res, api_error(400, fmt::format("the body is not valid JSON: {}", e.what())));
      return;
    }
    CompletionRequest r;
    if (auto e = parse_completion_request(body, chat, opts.limits, &r)) {
      send_error(res, *e);
      return;
    }
    if (fault.load() == Fault::kError && !r.stream) {
      send_error(res, api_error(500, "internal error (injected fault)", "server_error"));
      return;
    }
    // Held until the response is written (the stream's provider keeps it).
    Result<std::shared_ptr<ServedModel>> found = catalog->find(r.model);
    if (!found.ok()) {
      send_error(res, api_error(404, found.status().message(), "invalid_request_error", "model", "model_not_found"));
      return;
    }
    const std::shared_ptr<ServedModel> served = *found;
    Engine* engine = served->engine;
    const data::Tokenizer& tok = *served->tokenizer;
    // The model's sampling defaults for what the request left out.
    const SamplingDefaults& sd = served->sampling_defaults;
    if (sd.temperature && !r.temperature_given) r.sampling.temperature = *sd.temperature;
    if (sd.top_p && !r.top_p_given) r.sampling.top_p = *sd.top_p;
    if (sd.top_k && !r.top_k_given) r.sampling.top_k = *sd.top_k;
    std::vector<int> ids;
    if (auto e = resolve_prompt(&r, tok, engine->model().config(), &ids, served->chat_template.get())) {
      send_error(res, *e);
      return;
    }
    if (!r.max_tokens) {
      // A default (chat: the rest of the context) never asks for more than
      // the whole KV pool holds; an explicit max_tokens is the client's.
      const int64_t pool = int64_t{engine->options().kv_blocks} * engine->options().block_size;
      const int64_t room = pool - static_cast<int64_t>(ids.size());
      if (room >= 1) r.sampling.max_tokens = static_cast<int>(std::min<int64_t>(r.sampling.max_tokens, room));
    }
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!r.seed_given) r.sampling.seed = seeds();
      id = fmt::format("{}-{}{:08x}", chat ? "chatcmpl" : "cmpl", id_prefix, next_id++);
    }

    // A stream counts as in flight from before it is queued until its
    // response is written (the releaser), so shutdown() waits for it.
    std::shared_ptr<void> stream_token = r.stream ? streams.enter() : nullptr;
    auto call = std::make_shared<Call>(r.stop);
    const data::Tokenizer* t = &tok;
    if (r.resume) {
      // The text of the ids generated elsewhere passes through the stop
      // strings and the hold-back; what the client has not seen is sent first.
      bool stopped = false;
      call->skip = r.resume->sent_bytes;
      for (size_t i = ids.size() - static_cast<size_t>(r.resume->generated); i < ids.size(); i++)
        call->carry += call->unseen(call->text.add(token_bytes(*t, ids[i]), &stopped));
    }
    RequestSink sink;
    sink.on_admitted = [call] {
      std::lock_guard<std::mutex> lock(call->mu);
      call->admitted = true;
      call->cv.notify_all();
    };
    sink.on_token = [call, t](const TokenEvent& ev) {
      std::lock_guard<std::mutex> lock(call->mu);
      bool stopped = false;
      std::string piece = call->carry + call->unseen(call->text.add(token_bytes(*t, ev.token), &stopped));
      call->carry.clear();
      call->pieces.push_back({std::move(piece), ev, ev.last || stopped});
      call->cv.notify_all();
      return !stopped;
    };
    sink.on_finish = [call](const RequestResult& result) {
      std::lock_guard<std::mutex> lock(call->mu);
      call->tail = call->carry + call->unseen(call->text.finish());
      call->carry.clear();
      call->result = result;
      call->done = true;
      call->cv.notify_all();
    };
    std::vector<int> prompt_ids;
    if (r.return_token_ids) prompt_ids = ids;
    Result<uint64_t> sub = engine->submit(std::move(ids), r.sampling, std::move(sink));
    if (!sub.ok()) {
      send_error(res, error_of(sub.status()));
      return;
    }
    const uint64_t engine_id = *sub;
    const int64_t created = static_cast<int64_t>(std::time(nullptr));

    // Until admitted (or refused after waiting), the answer can still be an
    // error status; a stream's headers go out only once it runs.
    {
      std::unique_lock<std::mutex> lock(call->mu);
      call->cv.wait(lock, [&] { return call->admitted || call->done; });
      if (call->done && (!call->admitted || call->result.reason == FinishReason::kError)) {
        // Refused after queueing (timeout, shutdown) or failed at once.
        const Status st = call->result.status.ok() ? Status::Unavailable("the request was cancelled before it ran")
                                                   : call->result.status;
        lock.unlock();
        send_error(res, error_of(st));
        return;
      }
    }
    if (r.stream) {
      // The releaser ends the count now.
      stream(res, r, call, served, engine_id, id, created, std::move(prompt_ids), std::move(stream_token));
      return;
    }
    std::unique_lock<std::mutex> lock(call->mu);
    call->cv.wait(lock, [&] { return call->done; });
    lock.unlock();
    hang_while_injected();
    lock.lock();
    const RequestResult result = call->result;
    if (result.reason == FinishReason::kError || result.reason == FinishReason::kCancelled) {
      lock.unlock();
      send_error(res, error_of(result.status.ok() ? Status::Unavailable("the request was cancelled") : result.status));
      return;
    }
    std::string text;
    std::vector<int> token_ids;
    for (const Call::Piece& p : call->pieces) {
      text += p.text;
      token_ids.push_back(p.ev.token);
    }
    text += call->tail;
    json logprobs = r.sampling.logprobs >= 0 ? logprobs_json(tok, call->pieces, chat) : json(nullptr);
    lock.unlock();

    json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason_name(result.reason)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    if (r.return_token_ids) {
      choice["prompt_token_ids"] = prompt_ids;
      choice["token_ids"] = token_ids;
    }
    json out = {{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", served->id},
                {"choices", json::array({choice})},
                {"usage", usage(result)}};
    res.set_content(dump(out), "application/json");
    successes(finish_reason_name(result.reason)).add(1);
  }

  static json usage(const RequestResult& r) {
    return {{"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", r.completion_tokens},
            {"total_tokens", r.prompt_tokens + r.completion_tokens}};
  }

  static json token_string(const data::Tokenizer& tok, int id) { return sanitize_utf8(token_bytes(tok, id)); }

  // Completions: {tokens, token_logprobs, top_logprobs, text_offset};
  // chat: {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
  static json logprobs_json(const data::Tokenizer& tok, const std::vector<Call::Piece>& pieces, bool chat) {
    if (chat) {
      json content = json::array();
      for (const Call::Piece& p : pieces) {
        json top = json::array();
        for (const auto& [tid, lp] : p.ev.top) top.push_back({{"token", token_string(tok, tid)}, {"logprob", lp}});
        std::vector<int> bytes;
        for (char c : token_bytes(tok, p.ev.token)) bytes.push_back(static_cast<unsigned char>(c));
        content.push_back({{"token", token_string(tok, p.ev.token)},
                           {"logprob", p.ev.logprob},
                           {"bytes", bytes},
                           {"top_logprobs", top}});
      }
      return {{"content", content}};
    }
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    size_t offset = 0;
    for (const Call::Piece& p : pieces) {
      tokens.push_back(token_string(tok, p.ev.token));
      lps.push_back(p.ev.logprob);
      json top = json::object();
      for (const auto& [tid, lp] : p.ev.top) top[token_string(tok, tid).get<std::string>()] = lp;
      tops.push_back(top);
      offsets.push_back(offset);
      offset += tokens.back().get_ref<const std::string&>().size();
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  void stream(httplib::Response& res, const CompletionRequest& r, std::shared_ptr<Call> call,
              std::shared_ptr<ServedModel> served, uint64_t engine_id, const std::string& id, int64_t created,
              std::vector<int> prompt_ids, std::shared_ptr<void> counted) {
    const bool chat = r.chat;
    const bool token_ids = r.return_token_ids;
    const bool want_logprobs = r.sampling.logprobs >= 0;
    const bool include_usage = r.include_usage;
    auto chunk = [chat, id, created, include_usage, model_id = served->id](json choice) {
      json c = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model_id},
                {"choices", json::array({std::move(choice)})}};
      if (include_usage) c["usage"] = nullptr;
      return "data: " + dump(c) + "\n\n";
    };
    // Provider state: how many pieces were sent; whether the role chunk went.
    auto sent = std::make_shared<size_t>(0);
    auto started = std::make_shared<bool>(false);
    auto prompt_ids_pending = std::make_shared<bool>(token_ids);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, call, served, chunk, sent, started, chat, want_logprobs, include_usage, id, created, token_ids,
         prompt_ids_pending, prompt_ids = std::move(prompt_ids)](size_t, httplib::DataSink& sink) {
          std::string out;
          if (fault.load() == Fault::kHang) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            return true;
          }
          const bool failing = fault.load() == Fault::kError;
          if (failing && *sent >= fault_after.load()) {
            // A worker failing mid-stream: an error event, then the end.
            const ApiError e = api_error(500, "internal error (injected fault)", "server_error");
            out = "data: " + dump(e.body()) + "\n\ndata: [DONE]\n\n";
            errors(e.http).add(1);
            if (!sink.write(out.data(), out.size())) return false;
            sink.done();
            return true;
          }
          // The prompt's ids go with the first chunk (chat: the role's).
          bool& ids_pending = *prompt_ids_pending;
          if (chat && !*started) {
            json c = {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}};
            if (ids_pending) {
              c["prompt_token_ids"] = prompt_ids;
              c["token_ids"] = json::array();
              ids_pending = false;
            }
            out += chunk(c);
          }
          *started = true;
          std::vector<Call::Piece> fresh;
          bool done;
          RequestResult result;
          std::string tail;
          {
            std::unique_lock<std::mutex> lock(call->mu);
            call->cv.wait_for(lock, std::chrono::milliseconds(100),
                              [&] { return call->pieces.size() > *sent || call->done; });
            // An error injected after N tokens: the stream sends N, then
            // fails at the next call.
            size_t end = call->pieces.size();
            const bool cut = failing && end > fault_after.load();
            if (cut) end = fault_after.load();
            fresh.assign(call->pieces.begin() + static_cast<std::ptrdiff_t>(*sent),
                         call->pieces.begin() + static_cast<std::ptrdiff_t>(end));
            *sent = end;
            // The last token's chunk carries the finish reason (one chunk
            // per token): its end follows within the same engine step.
            if (!cut && !fresh.empty() && fresh.back().last)
              call->cv.wait_for(lock, std::chrono::seconds(1), [&] { return call->done; });
            done = call->done && !cut;
            if (done) {
              result = call->result;
              tail = call->tail;
            }
          }
          const bool completed =
              done && (result.reason == FinishReason::kStop || result.reason == FinishReason::kLength);
          // With the end known, the last token's chunk (or, when the end came
          // without a token: end-of-text, a stop string cut before it, a
          // chunk of its own) takes the text held back and the reason.
          const bool merge = completed && !fresh.empty() && fresh.back().last;
          for (size_t i = 0; i < fresh.size(); i++) {
            const Call::Piece& p = fresh[i];
            const bool final = merge && i + 1 == fresh.size();
            json choice = {{"index", 0},
                           {"finish_reason", final ? json(finish_reason_name(result.reason)) : json(nullptr)}};
            const std::string text = final ? p.text + tail : p.text;
            if (chat) {
              choice["delta"] = {{"content", text}};
            } else {
              choice["text"] = text;
            }
            choice["logprobs"] = want_logprobs ? logprobs_json(*served->tokenizer, {p}, chat) : json(nullptr);
            if (token_ids) {
              if (ids_pending) choice["prompt_token_ids"] = prompt_ids;
              ids_pending = false;
              choice["token_ids"] = {p.ev.token};
            }
            out += chunk(choice);
          }
          if (done) {
            if (completed) {
              if (!merge) {
                json choice = {{"index", 0}, {"logprobs", nullptr},
                               {"finish_reason", finish_reason_name(result.reason)}};
                if (chat) {
                  choice["delta"] = tail.empty() ? json::object() : json{{"content", tail}};
                } else {
                  choice["text"] = tail;
                }
                if (token_ids) {
                  if (ids_pending) choice["prompt_token_ids"] = prompt_ids;
                  ids_pending = false;
                  choice["token_ids"] = json::array();
                }
                out += chunk(choice);
              }
              if (include_usage) {
                json u = {{"id", id},
                          {"object", chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", created},
                          {"model", served->id},
                          {"choices", json::array()},
                          {"usage", usage(result)}};
                out += "data: " + dump(u) + "\n\n";
              }
              successes(finish_reason_name(result.reason)).add(1);
            } else {
              ApiError e = error_of(result.status.ok() ? Status::Unavailable("the request was cancelled")
                                                       : result.status);
              out += "data: " + dump(e.body()) + "\n\n";
              errors(e.http).add(1);
            }
            out += "data: [DONE]\n\n";
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;  // the client is gone
          if (done) sink.done();
          return true;
        },
        [call, served, engine_id,
         counted = std::make_shared<std::shared_ptr<void>>(std::move(counted))](bool success) {
          // Called once the stream ended, written or not: a client that went
          // away frees its sequence at the engine's next step.
          if (!success) served->engine->cancel(engine_id);
          counted->reset();
        });
  }
};

Server::Server(const ServerOptions& opts, obs::Registry& registry)
    : opts_(opts), registry_(registry), handlers_(std::make_unique<Handlers>(opts, registry)) {}

Server::~Server() {
  if (http_) {
    http_->stop();
    http_->wait();  // the request threads use the handlers
  }
}

Status Server::start(int threads_hint) {
  Handlers* h = handlers_.get();
  ASSIGN_OR_RETURN(http_, HttpServer::make(opts_.tls));
  httplib::Server& s = http_->routes();
  // Threads: see server.h; past kMaxThreads a request waits for one.
  constexpr int kMaxThreads = 512;
  HttpOptions ho;
  ho.threads = opts_.http_threads > 0 ? opts_.http_threads : std::clamp(threads_hint + 8, 8, kMaxThreads);
  ho.max_body_bytes = opts_.max_body_bytes;
  ho.door = opts_.door;
  configure_http(
      s, ho, [h](httplib::Response& res, const ApiError& e) { h->send_error(res, e); },
      [h](const std::string& path) {
        if (path != "/admin/fault") h->hang_while_injected();
      });
  if (opts_.fault_injection) {
    s.Post("/admin/fault", [h](const httplib::Request& req, httplib::Response& res) { h->inject(req, res); });
  }
  s.Get("/health", [h](const httplib::Request&, httplib::Response& res) { h->health(res); });
  s.Get("/metrics", [h](const httplib::Request&, httplib::Response& res) {
    res.set_content(h->registry.render_prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/v1/models", [h](const httplib::Request& req, httplib::Response& res) { h->models(req, res); });
  s.Post("/v1/completions",
         [h](const httplib::Request& req, httplib::Response& res) { h->completion(req, res, false); });
  s.Post("/v1/chat/completions",
         [h](const httplib::Request& req, httplib::Response& res) { h->completion(req, res, true); });
  ASSIGN_OR_RETURN(port_, http_->bind(opts_.host, opts_.port));
  return http_->start(ho, &registry_);
}

void Server::set_engine(Engine* engine, const data::Tokenizer* tokenizer) {
  auto model = std::make_shared<ServedModel>();
  model->id = opts_.model_name;
  model->engine = engine;
  model->tokenizer = tokenizer;
  set_models(single_model_catalog(std::move(model)));
}

void Server::set_models(std::shared_ptr<ModelCatalog> catalog) {
  handlers_->catalog = std::move(catalog);
  handlers_->phase = Phase::kReady;
}

bool Server::shutdown() {
  Handlers& h = *handlers_;
  const bool was_ready = h.phase.exchange(Phase::kDraining) == Phase::kReady;
  bool drained = true;
  if (was_ready) {
    drained = h.catalog->drain(opts_.drain_timeout_s);
    // The engine is idle; let the streams write their last chunks.
    drained = h.streams.wait_idle(10) && drained;
  }
  if (http_) http_->stop();
  return drained;
}

void Server::wait() {
  if (http_) http_->wait();
}

}  // namespace tessera::serve

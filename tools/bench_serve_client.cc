#include "tools/bench_serve_client.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <regex>
#include <string_view>
#include <thread>
#include <utility>

namespace tessera::tools {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr size_t kDetailBytes = 200;  // of an error body kept for the report

double seconds_since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

std::string transport_error(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "connection";
    case httplib::Error::ConnectionTimeout:
      return "connect_timeout";
    case httplib::Error::Read:
      return "read";
    case httplib::Error::Write:
      return "write";
    default:
      return "other";
  }
}

std::string one_line(std::string s) {
  if (s.size() > kDetailBytes) s.resize(kDetailBytes);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// Reads usage{prompt_tokens, completion_tokens} into t where present.
void read_usage(const json& j, CompletionTiming& t) {
  auto u = j.find("usage");
  if (u == j.end() || !u->is_object()) return;
  if (auto c = u->find("completion_tokens"); c != u->end() && c->is_number_integer()) t.output_tokens = c->get<int>();
  if (auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) t.prompt_tokens = p->get<int>();
}

bool has_choice(const json& j) {
  auto c = j.find("choices");
  return c != j.end() && c->is_array() && !c->empty();
}

// Server-sent events of a streamed completion, fed as bytes arrive. Works on
// lines (an event's blank-line terminator is just an empty line), so "\n" and
// "\r\n" endings and events split across reads are the same.
class StreamParser {
 public:
  StreamParser(CompletionTiming& t, Clock::time_point t0) : t_(t), t0_(t0) {}

  void feed(const char* data, size_t n, Clock::time_point now) {
    buf_.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(buf_.data() + start, nl - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      on_line(line, now);
    }
    buf_.erase(0, start);
  }

  // After the body ended: the error, if the stream was not a completion.
  void finish() {
    if (!t_.error.empty()) return;
    if (choice_chunks_ == 0) {
      t_.error = "bad_response";
      t_.error_detail = "a stream with no chunk carrying a choice";
    } else if (!done_) {
      t_.error = "bad_response";
      t_.error_detail = "a stream that did not end with data: [DONE]";
    } else if (!usage_seen_) {
      t_.output_tokens = choice_chunks_;
    }
  }

 private:
  void on_line(std::string_view line, Clock::time_point now) {
    if (line.substr(0, 5) != "data:" || !t_.error.empty()) return;  // comments, event:, id:, blank lines
    std::string_view payload = line.substr(5);
    if (!payload.empty() && payload.front() == ' ') payload.remove_prefix(1);
    if (payload == "[DONE]") {
      done_ = true;
      return;
    }
    json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      t_.error = "bad_response";
      t_.error_detail = one_line("unparsable chunk: " + std::string(payload));
      return;
    }
    if (j.contains("error")) {
      t_.error = "stream_error";
      t_.error_detail = one_line(j["error"].dump());
      return;
    }
    if (has_choice(j)) {
      const double t = seconds_since(t0_, now);
      if (choice_chunks_ == 0)
        t_.ttft_s = t;
      else
        t_.itl_s.push_back(t - last_chunk_s_);
      last_chunk_s_ = t;
      choice_chunks_++;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      usage_seen_ = true;
      read_usage(j, t_);
    }
  }

  CompletionTiming& t_;
  Clock::time_point t0_;
  std::string buf_;  // an incomplete last line
  int choice_chunks_ = 0;
  double last_chunk_s_ = 0;
  bool done_ = false, usage_seen_ = false;
};

// Why no HTTP answer came back, in words.
std::string transport_detail(httplib::Error e, const ClientOptions& o) {
  switch (e) {
    case httplib::Error::Connection:
      return "connection refused or host unreachable";
    case httplib::Error::ConnectionTimeout:
      return fmt::format("no connection within {:g} s", o.connect_timeout_s);
    case httplib::Error::Read:
      return fmt::format("no answer within {:g} s, or the connection closed", o.read_timeout_s);
    default:
      return httplib::to_string(e);
  }
}

std::string unreachable(const std::string& url, httplib::Error e, const ClientOptions& o) {
  return fmt::format("cannot reach {}: {} (is the server running?)", url, transport_detail(e, o));
}

}  // namespace

Result<ServeUrl> parse_serve_url(const std::string& url) {
  static const std::regex kUrl(R"(^(https?)://([^/:?#\[\]]+|\[[0-9A-Fa-f:.]+\])(:([0-9]{1,5}))?(/[^?#]*)?$)");
  std::smatch m;
  if (!std::regex_match(url, m, kUrl))
    return Status::InvalidArgument(
        fmt::format("--url: '{}' is not http[s]://host[:port][/path] (the server's root, without /v1)", url));
  if (m[4].matched && (std::stoi(m[4].str()) < 1 || std::stoi(m[4].str()) > 65535))
    return Status::InvalidArgument(fmt::format("--url: port {} is not in 1..65535", m[4].str()));
  ServeUrl u;
  u.scheme_host_port = m[1].str() + "://" + m[2].str() + m[3].str();
  u.base_path = m[5].str();
  while (!u.base_path.empty() && u.base_path.back() == '/') u.base_path.pop_back();
  u.host = m[2].str();
  if (u.host.front() == '[') u.host = u.host.substr(1, u.host.size() - 2);
  u.port = m[4].matched ? std::stoi(m[4].str()) : m[1].str() == "https" ? 443 : 80;
  return u;
}

CompletionClient::CompletionClient(const ServeUrl& url, const ClientOptions& options)
    : options_(options),
      base_path_(url.base_path),
      url_text_(url.scheme_host_port + url.base_path),
      http_(url.scheme_host_port) {
  const auto usec = [](double s) { return std::chrono::microseconds(static_cast<int64_t>(s * 1e6)); };
  http_.set_connection_timeout(usec(options.connect_timeout_s));
  http_.set_read_timeout(usec(options.read_timeout_s));
  http_.set_write_timeout(usec(options.read_timeout_s));
  http_.set_keep_alive(true);
  // httplib writes the headers and the body separately: with Nagle on, the
  // body waits for the server's delayed ACK (40 ms on Linux), inflating TTFT.
  http_.set_tcp_nodelay(true);
  if (!options.api_key.empty()) http_.set_bearer_token_auth(options.api_key);
}

CompletionTiming CompletionClient::complete(const CompletionRequest& request) {
  json body = {{"model", request.model},           {"prompt", request.prompt},
                     {"max_tokens", request.max_tokens}, {"temperature", request.temperature},
                     {"stream", request.stream},         {"ignore_eos", true}};
  // As vLLM's benchmark: the token count from the server's usage, not from
  // counting chunks.
  if (request.stream) body["stream_options"] = {{"include_usage", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = base_path_ + "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (request.stream) req.set_header("Accept", "text/event-stream");

  CompletionTiming t;
  t.prompt_tokens = static_cast<int>(request.prompt.size());
  int status = 0;
  std::string whole;  // the body of a non-streamed answer or of an error
  const Clock::time_point t0 = Clock::now();
  StreamParser stream(t, t0);
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status == 200 && request.stream)
      stream.feed(data, n, Clock::now());
    else if (status == 200 || whole.size() < kDetailBytes)
      whole.append(data, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = http_.send(req, res, err);
  t.e2e_s = seconds_since(t0, Clock::now());
  if (!sent) {
    t.error = transport_error(err);
    t.error_detail = transport_detail(err, options_);
    return t;
  }
  if (res.status != 200) {
    t.error = std::to_string(res.status);
    t.error_detail = one_line(whole);
    return t;
  }
  if (request.stream) {
    stream.finish();
    return t;
  }
  const json j = json::parse(whole, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !has_choice(j)) {
    t.error = "bad_response";
    t.error_detail = one_line(whole);
    return t;
  }
  // Without usage, ignore_eos promises exactly max_tokens.
  t.output_tokens = request.max_tokens;
  read_usage(j, t);
  return t;
}

Result<std::string> CompletionClient::first_model() {
  const std::string path = base_path_ + "/v1/models";
  httplib::Result r = http_.Get(path);
  if (!r) return Status::Unavailable(unreachable(url_text_, r.error(), options_));
  if (r->status != 200)
    return Status::InvalidArgument(
        fmt::format("GET {}{}: HTTP {} ({}); give --model", url_text_, "/v1/models", r->status, one_line(r->body)));
  const json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() && j["data"][0].is_object() &&
      j["data"][0].contains("id") && j["data"][0]["id"].is_string())
    return j["data"][0]["id"].get<std::string>();
  return Status::InvalidArgument(
      fmt::format("GET {}/v1/models: no model id in {}; give --model", url_text_, one_line(r->body)));
}

Status CompletionClient::reachable() {
  httplib::Result r = http_.Get(base_path_ + "/v1/models");
  if (!r) return Status::Unavailable(unreachable(url_text_, r.error(), options_));
  return Status::OK();
}

CompletionTiming engine_complete(serve::Engine& engine, const CompletionRequest& request, uint64_t seed) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    serve::RequestResult result;
    Clock::time_point last;
    double ttft_s = -1;
    std::vector<double> itl_s;
  } st;
  CompletionTiming t;
  serve::SamplingParams p;
  p.max_tokens = request.max_tokens;
  p.temperature = static_cast<float>(request.temperature);
  p.ignore_eos = true;
  p.seed = seed;
  const Clock::time_point t0 = Clock::now();
  serve::RequestSink sink;
  sink.on_token = [&st, t0](const serve::TokenEvent&) {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.ttft_s < 0) {
      st.ttft_s = seconds_since(t0, now);
    } else {
      st.itl_s.push_back(std::chrono::duration<double>(now - st.last).count());
    }
    st.last = now;
    return true;
  };
  sink.on_finish = [&st](const serve::RequestResult& r) {
    std::lock_guard<std::mutex> lock(st.mu);
    st.result = r;
    st.done = true;
    st.cv.notify_all();
  };
  Result<uint64_t> id = engine.submit(request.prompt, p, std::move(sink));
  if (!id.ok()) {
    t.error = id.status().code() == StatusCode::kResourceExhausted ? "429" : "other";
    t.error_detail = id.status().message();
    return t;
  }
  std::unique_lock<std::mutex> lock(st.mu);
  st.cv.wait(lock, [&] { return st.done; });
  t.e2e_s = seconds_since(t0, Clock::now());
  if (st.result.reason != serve::FinishReason::kLength && st.result.reason != serve::FinishReason::kStop) {
    t.error = "other";
    t.error_detail = st.result.status.message();
    return t;
  }
  if (request.stream) {
    t.ttft_s = st.ttft_s;
    t.itl_s = std::move(st.itl_s);
  }
  t.output_tokens = st.result.completion_tokens;
  t.prompt_tokens = st.result.prompt_tokens;
  return t;
}

struct SlowClients::State {
  ServeUrl url;
  bool tls = false;  // https: the connections never start their handshake
  int n = 0;
  double interval_s = 3;
  std::thread thread;
  std::atomic<bool> stop{false};
  mutable std::mutex mu;
  SlowCounts counts;  // under mu
  std::mutex started_mu;
  std::condition_variable started_cv;
  bool started = false;

  struct Slot {
    int fd = -1;
    Clock::time_point next;  // next header line, or the next open
    int lines = 0;
  };

  // A blocking connect (loopback: at once), then non-blocking.
  int open(int i) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(url.host.c_str(), std::to_string(url.port).c_str(), &hints, &res) != 0) return -1;
    const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && res->ai_family == AF_INET && url.host.rfind("127.", 0) == 0) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      from.sin_addr.s_addr = htonl((127u << 24) | (1u << 8) | static_cast<unsigned>(1 + i % 200));
      ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from));
    }
    timeval tv{2, 0};
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    if (!ok) {
      if (fd >= 0) ::close(fd);
      return -1;
    }
    if (tls) return fd;  // a handshake that never starts
    const std::string head = fmt::format("POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n",
                                         url.host);
    ::send(fd, head.data(), head.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return fd;
  }

  void run() {
    std::vector<Slot> slots(n);
    const auto gap = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s));
    auto reopen = [&](int i) {
      Slot& s = slots[i];
      s.fd = open(i);
      s.lines = 0;
      std::lock_guard<std::mutex> lock(mu);
      if (s.fd < 0) {
        counts.failed_connects++;
        s.next = Clock::now() + std::chrono::milliseconds(100);
      } else {
        counts.opened++;
        counts.open_now++;
        s.next = Clock::now() + gap;
      }
    };
    for (int i = 0; i < n && !stop; i++) reopen(i);
    {
      std::lock_guard<std::mutex> lock(started_mu);
      started = true;
    }
    started_cv.notify_all();
    std::vector<pollfd> fds(n);
    while (!stop) {
      for (int i = 0; i < n; i++) fds[i] = {slots[i].fd, POLLIN, 0};
      ::poll(fds.data(), fds.size(), 50);
      const Clock::time_point now = Clock::now();
      for (int i = 0; i < n && !stop; i++) {
        Slot& s = slots[i];
        if (s.fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
          char buf[512];
          const ssize_t got = ::recv(s.fd, buf, sizeof(buf), MSG_DONTWAIT);
          const std::string_view text(buf, got > 0 ? static_cast<size_t>(got) : 0);
          {
            std::lock_guard<std::mutex> lock(mu);
            counts.closed_by_server++;
            counts.open_now--;
            if (text.find(" 408 ") != std::string_view::npos) counts.answered_408++;
            if (text.find(" 503 ") != std::string_view::npos) counts.answered_503++;
          }
          ::close(s.fd);
          s.fd = -1;
          s.next = now + std::chrono::milliseconds(100);
          continue;
        }
        if (now < s.next) continue;
        if (s.fd < 0) {
          reopen(i);
          continue;
        }
        if (tls) continue;
        const std::string line = fmt::format("X-Slow-{}: {}\r\n", s.lines++, i);
        ::send(s.fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        s.next = now + gap;
      }
    }
    for (Slot& s : slots)
      if (s.fd >= 0) ::close(s.fd);
    std::lock_guard<std::mutex> lock(mu);
    counts.open_now = 0;
  }
};

SlowClients::SlowClients(const ServeUrl& url, int n, double interval_s) : s_(std::make_unique<State>()) {
  s_->url = url;
  s_->tls = url.scheme_host_port.rfind("https:", 0) == 0;
  s_->n = n;
  s_->interval_s = interval_s;
}

SlowClients::~SlowClients() { stop(); }

void SlowClients::start() {
  // One descriptor per connection: more than the common soft limit of 1024.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < static_cast<rlim_t>(s_->n) + 1024) {
    rl.rlim_cur = std::min(static_cast<rlim_t>(s_->n) + 1024, rl.rlim_max);
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  s_->thread = std::thread([s = s_.get()] { s->run(); });
  std::unique_lock<std::mutex> lock(s_->started_mu);
  s_->started_cv.wait(lock, [&] { return s_->started; });
}

void SlowClients::stop() {
  s_->stop = true;
  if (s_->thread.joinable()) s_->thread.join();
}

SlowCounts SlowClients::counts() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->counts;
}

}  // namespace tessera::tools

// The router's HTTP front end (serve/router.h) end to end in this process: a
// real Router on a loopback port in front of fake workers (real HTTP servers
// that speak the part of `tessera serve`'s protocol the router uses: /health,
// answers, streams with token ids, the "resume" field), and a real HTTP
// client. Both modes go through the one attempt loop (router.cc, Exchange);
// each test is one path through it. The retry policy's outcome classes are
// route_policy_test.cc; the shell drills (cli.route_*) run real workers.
#include "serve/router.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "obs/metrics.h"
#include "serve/fake_worker.h"

namespace tessera::serve {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

enum class Behaviour {
  kStream,       // the whole stream: tokens, finish_reason, usage, [DONE]
  kCutAfterTwo,  // two tokens, then the connection ends
  kNoDone,       // every token and the finish_reason, then the connection ends
  kServerError,  // 500
  kFull,         // 429
  kClientError,  // 400
};

constexpr int kPrompt[] = {1, 2, 3};

// One fake worker on 127.0.0.1 (fake_worker.h). Token k of a sequence is id
// 10+k, text 'a'+k; a request with "resume" continues at k = resume.generated.
class FakeWorker {
 public:
  FakeWorker(Behaviour b, std::string id)
      : behaviour_(b), id_(std::move(id)), server_([this](httplib::Server& s) {
          s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { post(req, res); });
        }) {}
  std::string url() const { return server_.url(); }
  int posts() const { return posts_; }
  json last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  void post(const httplib::Request& req, httplib::Response& res) {
    posts_++;
    const json body = json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = body;
    }
    switch (behaviour_) {
      case Behaviour::kServerError: return fake::server_error(res);
      case Behaviour::kFull: return fake::full(res);
      case Behaviour::kClientError: return fake::client_error(res);
      default: break;
    }
    if (!body.value("stream", false)) {
      res.set_content(json{{"id", id_}, {"object", "text_completion"}, {"model", "fake-model"},
                           {"choices", {{{"index", 0}, {"text", "hi"}, {"finish_reason", "stop"}}}}}
                          .dump(),
                      "application/json");
      return;
    }
    const int first = body.contains("resume") ? body["resume"]["generated"].get<int>() : 0;
    const int count = body.value("max_tokens", 16);
    std::vector<std::string> events;
    auto chunk = [&](json choice) {
      return json{{"id", id_}, {"object", "text_completion"}, {"created", 7}, {"model", "fake-model"},
                  {"choices", {std::move(choice)}}}
          .dump();
    };
    for (int k = first; k < first + count; k++) {
      json c = {{"index", 0}, {"text", std::string(1, static_cast<char>('a' + k))}, {"token_ids", {10 + k}},
                {"finish_reason", nullptr}};
      if (k == first) c["prompt_token_ids"] = kPrompt;
      events.push_back(chunk(c));
    }
    events.push_back(chunk({{"index", 0}, {"text", ""}, {"finish_reason", "length"}}));
    events.push_back(json{{"id", id_}, {"object", "text_completion"}, {"created", 7}, {"choices", json::array()},
                          {"usage", {{"prompt_tokens", 3}, {"completion_tokens", count}}}}
                         .dump());
    events.push_back("[DONE]");
    size_t keep = events.size();
    if (behaviour_ == Behaviour::kCutAfterTwo) keep = 2;
    if (behaviour_ == Behaviour::kNoDone) keep = events.size() - 2;  // no usage, no [DONE]
    events.resize(keep);
    res.set_chunked_content_provider("text/event-stream", [events](size_t, httplib::DataSink& sink) {
      for (const std::string& e : events) {
        const std::string bytes = "data: " + e + "\n\n";
        sink.write(bytes.data(), bytes.size());
      }
      if (events.back() == "[DONE]") {
        sink.done();
        return true;
      }
      return false;  // the connection ends mid-stream
    });
  }

  Behaviour behaviour_;
  std::string id_;
  std::atomic<int> posts_{0};
  std::mutex mu_;
  json last_;
  fake::LoopbackServer server_;  // last: it stops (and joins) first
};

// A router on a free loopback port over tiers a, b, ... (one worker each, in
// order), quick deadlines.
struct RouterUnderTest {
  obs::Registry registry;
  std::unique_ptr<Router> router;

  explicit RouterUnderTest(const std::vector<const FakeWorker*>& tiers) {
    RouterOptions o;
    o.port = 0;
    o.model_name = "served";
    o.workers.connect_timeout_s = 0.5;
    o.workers.stall_timeout_s = 2.0;
    o.workers.wait_for_worker_s = 0.2;
    char name = 'a';
    for (const FakeWorker* w : tiers) o.tiers.push_back(RouteTier{std::string(1, name++), {w->url()}});
    router = std::make_unique<Router>(o, registry);
    const Status st = router->start();
    EXPECT_TRUE(st.ok()) << st.message();
  }
  ~RouterUnderTest() {
    router->shutdown();
    router->wait();
  }
  httplib::Result post(const json& body) {
    httplib::Client cli("127.0.0.1", router->port());
    cli.set_read_timeout(10, 0);
    return cli.Post("/v1/completions", body.dump(), "application/json");
  }
  double answered(int code) {
    return registry.counter("tessera_route_requests_total", "", {{"code", std::to_string(code)}}).value();
  }
};

// The data: payloads of an event stream.
std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

// The text of a stream, its ids and its usage chunk (null when none).
struct Stream {
  std::string text;
  std::vector<std::string> ids;
  json usage;
  bool done = false;
  bool token_ids_leaked = false;
};
Stream read_stream(const std::string& body) {
  Stream s;
  for (const std::string& e : events(body)) {
    if (e == "[DONE]") {
      s.done = true;
      continue;
    }
    const json c = json::parse(e);
    s.ids.push_back(c.value("id", ""));
    if (c.contains("usage") && !c["usage"].is_null()) s.usage = c["usage"];
    if (!c["choices"].empty()) {
      s.text += c["choices"][0].value("text", "");
      s.token_ids_leaked |= c["choices"][0].contains("token_ids");
    }
  }
  return s;
}

json streamed(int max_tokens) {
  return {{"prompt", "x"}, {"max_tokens", max_tokens}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
}

TEST(Router, AnAnswerIsRelayedUnderTheRoutersModelName) {
  FakeWorker a(Behaviour::kStream, "cmpl-a");
  RouterUnderTest r({&a});
  httplib::Result res = r.post({{"prompt", "x"}, {"max_tokens", 4}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("X-Tessera-Tier"), "a");
  const json j = json::parse(res->body);
  EXPECT_EQ(j["model"], "served");
  EXPECT_EQ(j["choices"][0]["text"], "hi");
  EXPECT_EQ(a.last_request()["model"], "fake-model") << "the worker is asked under its own model name";
  EXPECT_EQ(r.answered(200), 1);
}

TEST(Router, AnUnstreamedRequestIsSentAgainToTheNextTier) {
  FakeWorker a(Behaviour::kServerError, "cmpl-a"), b(Behaviour::kStream, "cmpl-b");
  RouterUnderTest r({&a, &b});
  httplib::Result res = r.post({{"prompt", "x"}, {"max_tokens", 4}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("X-Tessera-Tier"), "b");
  EXPECT_EQ(json::parse(res->body)["id"], "cmpl-b");
  EXPECT_EQ(a.posts(), 1);
  EXPECT_EQ(b.posts(), 1);
}

TEST(Router, ACutStreamContinuesOnTheNextTierAsOneStream) {
  FakeWorker a(Behaviour::kCutAfterTwo, "cmpl-a"), b(Behaviour::kStream, "cmpl-b");
  RouterUnderTest r({&a, &b});
  httplib::Result res = r.post(streamed(5));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("X-Tessera-Tier"), "a") << "where the stream began";
  const Stream s = read_stream(res->body);
  EXPECT_EQ(s.text, "abcde") << "nothing lost, nothing twice";
  for (const std::string& id : s.ids) EXPECT_EQ(id, "cmpl-a") << "one stream under the first id";
  EXPECT_TRUE(s.done);
  EXPECT_FALSE(s.token_ids_leaked) << "token ids only when the client asks";
  ASSERT_TRUE(s.usage.is_object());
  EXPECT_EQ(s.usage["prompt_tokens"], 3);
  EXPECT_EQ(s.usage["completion_tokens"], 5) << "counted across both workers";
  // b continued the sequence: the prompt and a's two tokens, three left.
  const json resume = b.last_request()["resume"];
  EXPECT_EQ(resume["token_ids"], json({1, 2, 3, 10, 11}));
  EXPECT_EQ(resume["generated"], 2);
  EXPECT_EQ(resume["sent_bytes"], 2);
  EXPECT_EQ(b.last_request()["max_tokens"], 3);
  EXPECT_EQ(r.answered(200), 1);
}

TEST(Router, AStreamWhoseEndWasLostIsCompletedByTheRouter) {
  FakeWorker a(Behaviour::kNoDone, "cmpl-a"), b(Behaviour::kStream, "cmpl-b");
  RouterUnderTest r({&a, &b});
  httplib::Result res = r.post(streamed(3));
  ASSERT_TRUE(res);
  const Stream s = read_stream(res->body);
  EXPECT_EQ(s.text, "abc");
  EXPECT_TRUE(s.done);
  ASSERT_TRUE(s.usage.is_object()) << "the usage chunk the worker did not send";
  EXPECT_EQ(s.usage["completion_tokens"], 3);
  EXPECT_EQ(b.posts(), 0) << "every token had arrived: nothing to ask again";
  EXPECT_EQ(r.answered(200), 1);
}

TEST(Router, AClientErrorIsPassedThroughInBothModes) {
  FakeWorker a(Behaviour::kClientError, "cmpl-a"), b(Behaviour::kStream, "cmpl-b");
  RouterUnderTest r({&a, &b});
  for (const json& body : {json{{"prompt", "x"}, {"max_tokens", 4}}, streamed(4)}) {
    SCOPED_TRACE(body.dump());
    httplib::Result res = r.post(body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400);
    EXPECT_EQ(json::parse(res->body)["error"]["message"], "'max_tokens' must be positive");
  }
  EXPECT_EQ(b.posts(), 0) << "the client's error is not retried";
  EXPECT_EQ(r.answered(400), 2);
}

TEST(Router, EveryWorkerFullGivesTheWorkersOwn429InBothModes) {
  FakeWorker a(Behaviour::kFull, "cmpl-a"), b(Behaviour::kFull, "cmpl-b");
  RouterUnderTest r({&a, &b});
  for (const json& body : {json{{"prompt", "x"}, {"max_tokens", 4}}, streamed(4)}) {
    SCOPED_TRACE(body.dump());
    httplib::Result res = r.post(body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 429);
    EXPECT_EQ(res->get_header_value("Retry-After"), "1");
    EXPECT_EQ(json::parse(res->body)["error"]["code"], "queue_full");
  }
  EXPECT_EQ(a.posts(), 2);
  EXPECT_EQ(b.posts(), 2);
}

TEST(Router, NoWorkerLeftGivesA503NamingTheLastFailure) {
  FakeWorker a(Behaviour::kServerError, "cmpl-a");
  RouterUnderTest r({&a});
  httplib::Result res = r.post({{"prompt", "x"}, {"max_tokens", 4}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  const std::string message = json::parse(res->body)["error"]["message"];
  EXPECT_NE(message.find("the engine failed"), std::string::npos) << message;
  EXPECT_EQ(r.answered(503), 1);
}

}  // namespace
}  // namespace tessera::serve

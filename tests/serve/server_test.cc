// The HTTP server's life cycle (serve/server.h), in-process with a real
// client: 503 while loading, serving once the engine is set, 503 while
// draining, and a clean stop. The endpoints' behaviour under load is in
// tests/cli/serve_*.sh against the real `tessera serve` process.
#include <httplib.h>

#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "nn/gpt.h"
#include "obs/metrics.h"
#include "serve/engine.h"
#include "serve/server.h"
#include "aborting.h"

namespace tessera::serve {
namespace {

using testing_util::make_gpt;
using json = nlohmann::json;

TEST(ServeServer, LoadingThenServingThenDraining) {
  obs::Registry reg;
  ServerOptions so;
  so.port = 0;
  so.model_name = "m";
  so.drain_timeout_s = 10;
  Server server(so, reg);
  ASSERT_TRUE(server.start(8).ok());
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(30, 0);

  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body)["status"], "loading");
  auto early = c.Post("/v1/completions", R"({"prompt":[1,2]})", "application/json");
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 503);
  EXPECT_TRUE(json::parse(early->body)["error"]["message"].is_string());

  auto model = make_gpt(GPTConfig{2, 4, 64, 256, 64}, Backend::kCPU, ModelShard{}, nullptr,
                                     ModelUse::kInference);
  model->init_weights(1);
  auto engine = Engine::create(std::move(model), EngineOptions{}, reg);
  ASSERT_TRUE(engine.ok());
  data::ByteTokenizer tok;
  server.set_engine(engine->get(), &tok);

  health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto done = c.Post("/v1/completions", R"({"prompt":[1,2],"max_tokens":5,"ignore_eos":true})", "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200) << done->body;
  const json j = json::parse(done->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");

  // A streamed request in flight when shutdown() begins still completes.
  std::string streamed;
  std::thread client([&] {
    httplib::Client s("127.0.0.1", server.port());
    s.set_read_timeout(30, 0);
    auto r = s.Post("/v1/completions", R"({"prompt":[3],"max_tokens":60,"ignore_eos":true,"stream":true})",
                    "application/json");
    if (r) streamed = r->body;
  });
  // Until the stream has begun (5 tokens came from the first request; a
  // loaded machine may take seconds to get here, a quiet one may already
  // have finished the stream: both are fine).
  obs::Counter& generated = reg.counter("tessera_generation_tokens_total", "");
  for (int i = 0; i < 30000 && generated.value() <= 5; i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(generated.value(), 5) << "the streamed request never started";
  EXPECT_TRUE(server.shutdown());
  client.join();
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << streamed.substr(0, 300);
  EXPECT_NE(streamed.find("\"finish_reason\":\"length\""), std::string::npos);
  server.wait();
}

TEST(ServeServer, RefusesAPortInUse) {
  obs::Registry reg;
  ServerOptions so;
  so.port = 0;
  Server a(so, reg);
  ASSERT_TRUE(a.start(1).ok());
  so.port = a.port();
  Server b(so, reg);
  const Status st = b.start(1);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find(std::to_string(a.port())), std::string::npos) << st.message();
  a.shutdown();
  a.wait();
}

}  // namespace
}  // namespace tessera::serve

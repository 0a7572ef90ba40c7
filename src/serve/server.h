// `tessera serve`'s HTTP side: an OpenAI-compatible API (openai.h) over the
// continuous-batching engine (engine.h), through cpp-httplib.
//
//   POST /v1/completions, /v1/chat/completions  (stream: server-sent events)
//   GET  /v1/models, /health, /metrics
//   POST /admin/fault  (with fault_injection, from loopback only)
//
// Faults: a device error in the engine (Engine::fault) turns /health into
// 503 {"status": "device_error", "reason": ...} and new requests into 503s.
// With fault_injection, POST /admin/fault {"fault": F} makes the worker
//   hang:         every request but /admin waits, /health too, and streams
//                 stop writing, until the fault is cleared;
//   error:        every /v1 request, and every stream at its next chunk,
//                 fails with 500 (/health still says ok); with
//                 "after_tokens": N, streams are taken and each fails after
//                 sending N tokens (a mid-stream failure, for tests);
//   device_error: as a real device error (Engine::set_fault);
//   none:         clears any of them.
//
// Life cycle: start() binds and listens at once, so /health answers 503
// ("loading") while the caller loads the model; set_engine() makes it ready.
// shutdown() (SIGTERM) refuses new requests with 503, lets queued and running
// ones finish within the drain timeout, then stops listening; run() returns.
//
// Threads: cpp-httplib's pool serves connections, one thread each for the
// life of a request (a streamed one included), sized max_seqs + max_queue +
// a few, so that a full queue is still answered (429) rather than left
// waiting for a thread. Every request thread only parses, queues into the
// engine and waits on its own request's buffer; the engine's thread does all
// model work.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.h"
#include "data/tokenizer.h"
#include "obs/metrics.h"
#include "serve/engine.h"
#include "serve/openai.h"

namespace httplib {
class Server;
}

namespace tessera::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (port() tells which)
  std::string api_key;             // empty: no authentication
  std::string model_name;          // the id clients name in "model"
  std::string backend = "cpu";     // for /health
  size_t max_body_bytes = 1 << 20;
  int http_threads = 0;            // 0: from the engine's limits
  double drain_timeout_s = 30;
  bool fault_injection = false;    // POST /admin/fault from loopback (drills, tests)
  ApiLimits limits;
};

class Server {
 public:
  Server(const ServerOptions& opts, obs::Registry& registry);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts serving in a background thread. Unavailable
  // naming the address when it cannot bind.
  Status start(int threads_hint);
  int port() const { return port_; }
  // Makes the API live. The engine and tokenizer must outlive the server.
  void set_engine(Engine* engine, const data::Tokenizer* tokenizer);
  // Stops accepting work, drains the engine (drain_timeout_s), waits for the
  // responses in flight to be written, then stops listening. Any thread;
  // returns whether everything drained in time.
  bool shutdown();
  // Blocks until the server stopped (after shutdown(), or a listen error).
  void wait();

 private:
  struct Handlers;
  ServerOptions opts_;
  obs::Registry& registry_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<Handlers> handlers_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace tessera::serve

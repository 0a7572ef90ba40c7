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
// ("loading") while the caller loads the model; set_engine() or set_models()
// makes it ready.
//
// Models: each request looks its model up in a ModelCatalog (one fixed
// model, or a registry's promoted version that can change while serving,
// registry_catalog.h) and holds the ServedModel it got until its response is
// written; a model the catalog drops finishes those requests, then is freed.
// shutdown() (SIGTERM) refuses new requests with 503, lets queued and running
// ones finish within the drain timeout, then stops listening; run() returns.
//
// Threads: the front end (http_server.h) holds connections while they are
// idle or their request arrives; a complete request gets one request thread
// for its life (a streamed one included), from a pool sized max_seqs +
// max_queue + a few, so that a full queue is still answered (429) rather
// than left waiting for a thread. Every request thread only parses, queues into the
// engine and waits on its own request's buffer; the engine's thread does all
// model work.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "obs/metrics.h"
#include "serve/http_server.h"
#include "serve/engine.h"
#include "serve/openai.h"

namespace httplib {
class Server;
}

namespace tessera::serve {

// One loaded model: the engine and the tokenizer of the requests sent to it,
// under the id responses report ("tiny", "tiny:2"). Shared: the catalog and
// every request using it hold it; the last holder frees it (the engine first:
// its thread calls into the tokenizer). Never held by an engine callback,
// so an engine is never destroyed on its own thread.
struct ServedModel {
  std::string id;
  std::unique_ptr<data::Tokenizer> owned_tokenizer;  // may be null: the caller owns it
  const data::Tokenizer* tokenizer = nullptr;
  // The model's chat template (a Hugging Face folder's); null: the plain-text
  // chat format (openai.h: chat_prompt).
  std::shared_ptr<const data::ChatTemplate> chat_template;
  SamplingDefaults sampling_defaults;  // generation_config.json's, for fields a request leaves out
  std::unique_ptr<Engine> owned_engine;              // may be null: the caller owns it
  Engine* engine = nullptr;
};

// The models a server answers for. Thread safe: every request thread calls it.
class ModelCatalog {
 public:
  virtual ~ModelCatalog() = default;
  // The model a request's "model" names ("": the default one). NotFound with
  // a message for the client when there is none.
  virtual Result<std::shared_ptr<ServedModel>> find(const std::string& requested) = 0;
  // (id, model) pairs for /v1/models, the default first.
  virtual std::vector<std::pair<std::string, std::shared_ptr<ServedModel>>> listed() = 0;
  // At shutdown: no more changes; drains every engine still loaded (see
  // Engine::drain) and returns whether all finished within timeout_s.
  virtual bool drain(double timeout_s) = 0;
};

// A catalog of one fixed model, named by its id.
std::shared_ptr<ModelCatalog> single_model_catalog(std::shared_ptr<ServedModel> model);

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
  TlsOptions tls;                  // all empty: plain HTTP
  DoorLimits door;                 // slow and many clients (http.h)
};

class Server {
 public:
  Server(const ServerOptions& opts, obs::Registry& registry);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts serving in a background thread (TLS when
  // opts.tls says so). Unavailable naming the address when it cannot bind;
  // InvalidArgument for TLS files that cannot be used (HttpServer::make).
  Status start(int threads_hint);
  int port() const { return port_; }
  // Makes the API live with one model under opts.model_name. The engine and
  // tokenizer must outlive the server.
  void set_engine(Engine* engine, const data::Tokenizer* tokenizer);
  // Makes the API live with the models of a catalog.
  void set_models(std::shared_ptr<ModelCatalog> catalog);
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
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<Handlers> handlers_;
  int port_ = 0;
};

}  // namespace tessera::serve

// The HTTP side of `tessera bench serve`: one OpenAI-compatible completion
// request, sent and timed the way vLLM's benchmark_serving times it.
//
// A CompletionClient owns one httplib::Client (one keep-alive connection,
// reopened by httplib when the server closes it) and is used by one thread
// at a time; the load generator gives each worker thread its own. Every
// network wait is bounded by the connect and read timeouts it is built with.
// Nothing here throws or exits: a request that fails comes back as a
// CompletionTiming whose `error` names why, a failed model lookup as a Status.
#pragma once

#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "serve/engine.h"

namespace tessera::tools {

// --url split for httplib: "http://host:8000/prefix" -> scheme_host_port
// "http://host:8000", base_path "/prefix" (no trailing slash; "" for none).
struct ServeUrl {
  std::string scheme_host_port;
  std::string base_path;
  std::string host;  // without brackets for IPv6
  int port = 0;      // the URL's, else 80 or 443
};
// Only http:// and https:// with a host; a bad URL is InvalidArgument.
Result<ServeUrl> parse_serve_url(const std::string& url);

struct ClientOptions {
  double connect_timeout_s = 5;
  double read_timeout_s = 120;  // per read: a stream may last longer, a gap may not
  std::string api_key;          // "" for none; else "Authorization: Bearer <key>"
};

// POST {base}/v1/completions with {"model", "prompt": [ids], "max_tokens",
// "temperature", "stream", "ignore_eos": true}.
struct CompletionRequest {
  std::string model;
  std::vector<int> prompt;  // token ids
  int max_tokens = 0;
  double temperature = 0;
  bool stream = false;
};

// What one request measured. Times are seconds from just before the request
// was written to the socket.
struct CompletionTiming {
  // "" on success. Otherwise the HTTP status ("500", "429"), a transport
  // failure ("connection", "connect_timeout", "read", "write", "other"), a
  // 200 whose body is not a completion ("bad_response"), or an error event
  // inside a stream ("stream_error").
  std::string error;
  std::string error_detail;   // the first bytes of the body, or httplib's message
  double e2e_s = 0;           // until the response (or stream) ended
  double ttft_s = -1;         // stream: until the first chunk carrying a choice; -1 otherwise
  std::vector<double> itl_s;  // stream: every gap between consecutive chunks carrying a choice
  int output_tokens = 0;      // usage.completion_tokens, else (stream) the chunks carrying a choice
  int prompt_tokens = 0;      // usage.prompt_tokens, else the prompt's length
};

class CompletionClient {
 public:
  CompletionClient(const ServeUrl& url, const ClientOptions& options);

  // Sends one request and waits for the whole response.
  CompletionTiming complete(const CompletionRequest& request);
  // GET {base}/v1/models: the first model's id. A transport failure is
  // Unavailable ("connection refused ..."), anything else InvalidArgument.
  Result<std::string> first_model();
  // The same GET, for when the model is known: OK if any HTTP answer came back.
  Status reachable();

 private:
  ClientOptions options_;
  std::string base_path_;
  std::string url_text_;  // for messages
  httplib::Client http_;
};

// `bench serve --slow-connections N`: N connections that each send a
// request line and then one header line every `interval_s`, never the end
// of the headers (a "slowloris"). A connection the server closes is opened
// again after 100 ms, so N stay open as far as the server lets them. On a
// 127.x host, connection i comes from 127.0.1.(1 + i % 200): 200 client
// addresses, as many hosts would be. With https the connections never
// start their TLS handshake instead. One thread; start() returns once all
// N have been opened (or failed to), stop() closes them.
struct SlowCounts {
  long opened = 0;           // connections opened, reopenings included
  long closed_by_server = 0; // of those, closed (or answered) by the server
  long answered_408 = 0;     // with "408 Request Timeout" first
  long answered_503 = 0;     // with "503" first (a connection cap)
  long failed_connects = 0;  // connect() refused or timed out
  long open_now = 0;
};

class SlowClients {
 public:
  SlowClients(const ServeUrl& url, int n, double interval_s);
  ~SlowClients();
  void start();
  void stop();
  SlowCounts counts() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The same request run in-process on an engine (`bench serve --engine`): no
// HTTP, no JSON, no tokenizer, timed the same way (a stream's chunk is a
// token callback), to measure what the HTTP layer costs. Thread-safe.
CompletionTiming engine_complete(serve::Engine& engine, const CompletionRequest& request, uint64_t seed);

}  // namespace tessera::tools

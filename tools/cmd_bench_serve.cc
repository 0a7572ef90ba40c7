// tessera bench serve: a load generator for an OpenAI-compatible server
// (`tessera serve`, vLLM, ...), reporting what vLLM's benchmark_serving
// reports.
//
//   tessera bench serve --url http://127.0.0.1:8000 [--concurrency N | --rate R]
//       --requests N --prompt-tokens P --max-tokens M [--stream] [--json]
//
// Every request is POST {url}/v1/completions with P random token ids (uniform
// in [0, 256), valid for every model; request i's ids depend only on --seed
// and i) and "ignore_eos": true, so each answer has exactly M tokens. The
// model is --model, else the first id GET {url}/v1/models lists; that GET is
// sent first either way, so a server that is not there is one error line.
//
// Load: --concurrency N keeps N requests in flight (closed loop: N threads,
// each sends its next request when the last one ends). --rate R sends at
// Poisson arrivals, R per second on average (exponential gaps from --seed),
// with at most --max-in-flight outstanding: an arrival that finds them all
// busy waits for one, so the achieved rate can fall below R. --warmup K
// requests (closed loop at --concurrency, one at a time with --rate; not
// counted) go before the timed run, with prompts of their own.
//
// Figures, over the requests that succeeded (times in ms):
//   duration_s               first request sent to last response ended
//   request_throughput       completed / duration_s (req/s)
//   output_throughput        total_output_tokens / duration_s (tok/s)
//   total_token_throughput   (total_input_tokens + total_output_tokens) / duration_s
//   ttft                     time to the first streamed chunk carrying a choice
//   tpot                     per request (e2el - ttft) / (output_tokens - 1), for
//                            output_tokens > 1; without --stream e2el / output_tokens
//   itl                      every gap between consecutive chunks carrying a choice
//   e2el                     request sent to response (or stream) ended
// each as mean, p50 and p99 (linear interpolation, numpy's default; vLLM's
// "median" is p50). Without --stream, ttft and itl are unavailable: "n/a" in
// the table, null in JSON. Output tokens are usage.completion_tokens, else the
// chunks carrying a choice (stream) or M (no stream, no usage).
//
// --json prints one object on stdout instead of the table, keys in order:
//   url model stream mode ("concurrency" | "rate") concurrency (null with --rate)
//   request_rate max_in_flight (null with --concurrency) requests prompt_tokens
//   max_tokens warmup seed completed failed errors ({label: count}; label an
//   HTTP status "500", or "connection", "connect_timeout", "read", "write",
//   "other", "bad_response", "stream_error") duration_s total_input_tokens
//   total_output_tokens request_throughput output_throughput
//   total_token_throughput, then {mean,p50,p99}_{ttft,tpot,itl,e2el}_ms,
//   max_e2el_ms duration_limit_s slow_connections, and with slow connections
//   slow_{opened,closed_by_server,answered_408,answered_503,failed_connects}.
//
// --duration S stops sending new requests after S seconds. --slow-connections
// N holds N slowloris connections open during the run (SlowClients in
// bench_serve_client.h), to measure a server beside them.
// docs/serving.md ("Load generator") says the same for users.
//
// --engine MODEL instead of --url runs the same load in this process, on a
// serve::Engine over the model (--dtype, --max-seqs), with no HTTP: the
// figures compared with a --url run against `tessera serve` at the same load
// give the cost of the HTTP layer (docs/performance.md).
//
// Exit: 0 when the run finished and some request succeeded (failed ones are
// counted, with each label's first error body on stderr); 1 when every
// request failed (after the report), or the server cannot be reached or has
// no model; 2 for bad flags (a malformed --url too). Every wait is bounded by
// --connect-timeout and --timeout.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nn/gpt2_weights.h"
#include "obs/metrics.h"
#include "serve/engine.h"
#include "tools/bench_serve_client.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct ServeBenchArgs {
  std::string url, model, api_key;
  std::string engine_model, dtype = "fp32";  // --engine: in-process
  int max_seqs = 32;
  int concurrency = 1;
  double rate = 0;  // requests/s; 0: closed loop at --concurrency
  int max_in_flight = 256;
  int requests = 64, warmup = 0;
  int prompt_tokens = 32, max_tokens = 32;
  int shared_prefix = 0;  // leading prompt tokens every request has in common (a system prompt)
  double temperature = 0;
  uint64_t seed = 0;
  bool stream = false, json = false;
  double timeout_s = 120, connect_timeout_s = 5;
  double duration_s = 0;     // > 0: no new request after this many seconds
  int slow_connections = 0;  // slowloris connections held open during the run
  double slow_interval_s = 3;
};

constexpr int kMaxCount = 1 << 30;  // bound of the count flags
constexpr int kPromptVocab = 256;   // ids every model accepts (the byte-level ones have 256)

// Request i's prompt: a function of (seed, i) alone, whichever thread sends
// it; its first `shared` tokens are every request's (those of index -1).
std::vector<int> prompt_of(uint64_t seed, int i, int length, int shared = 0) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(i)};
  std::mt19937 rng(seq);
  std::uniform_int_distribution<int> id(0, kPromptVocab - 1);
  std::vector<int> ids(length);
  for (int& t : ids) t = id(rng);
  if (shared > 0 && i != -1) {
    const std::vector<int> common = prompt_of(seed, -1, std::min(shared, length));
    std::copy(common.begin(), common.end(), ids.begin());
  }
  return ids;
}

// Poisson arrivals: send times (s from the start) with exponential gaps of
// mean 1/rate; the first request goes at once. At most n, and none at or
// after until_s when it is > 0 (--duration).
std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed, double until_s = 0) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<double> at{0.0};
  while (static_cast<int>(at.size()) < n) {
    const double t = at.back() + gap(rng);
    if (until_s > 0 && t >= until_s) break;
    at.push_back(t);
  }
  return at;
}

// Sends requests first .. first+count-1 from `workers` threads, each with its
// own connection. arrival_s empty: closed loop; else request i waits until
// arrival_s[i] (or a free thread, whichever is later). Returns the timings in
// request order and the wall time of the whole run.
// One worker's way to run a request: an HTTP client, or the engine.
using Sender = std::function<CompletionTiming(const CompletionRequest&, int index)>;
using SenderFactory = std::function<Sender()>;

std::vector<CompletionTiming> run_requests(const ServeBenchArgs& a, const SenderFactory& make_sender,
                                           const std::string& model, int first, int count, int workers,
                                           const std::vector<double>& arrival_s, double* duration_s) {
  // Each thread keeps what it ran (with --duration, --requests may be far
  // more than are sent: nothing is sized by it).
  const int n_threads = std::min(workers, count);
  std::vector<std::vector<std::pair<int, CompletionTiming>>> ran(n_threads);
  std::atomic<int> next{0};
  const Clock::time_point start = Clock::now();
  const auto expired = [&] {
    return a.duration_s > 0 && std::chrono::duration<double>(Clock::now() - start).count() >= a.duration_s;
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < n_threads; w++) {
    threads.emplace_back([&, w] {
      Sender send = make_sender();
      for (int i; !expired() && (i = next.fetch_add(1)) < count;) {
        const CompletionRequest req{model, prompt_of(a.seed, first + i, a.prompt_tokens, a.shared_prefix), a.max_tokens, a.temperature,
                                    a.stream};
        if (!arrival_s.empty())
          std::this_thread::sleep_until(
              start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival_s[i])));
        ran[w].emplace_back(i, send(req, first + i));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  *duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  // Every index claimed was run: 0 .. min(next, count) - 1, in order.
  std::vector<CompletionTiming> out(std::min(next.load(), count));
  for (auto& mine : ran)
    for (auto& [i, t] : mine) out[i] = std::move(t);
  return out;
}

// Mean, p50, p99 of a sample, in ms; empty: unavailable.
struct Summary {
  double mean_ms = 0, p50_ms = 0, p99_ms = 0, max_ms = 0;
};

// numpy.percentile's default: linear between the two nearest ranks.
double percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(rank);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (rank - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

std::optional<Summary> summarize(std::vector<double> seconds) {
  if (seconds.empty()) return std::nullopt;
  std::sort(seconds.begin(), seconds.end());
  double sum = 0;
  for (double s : seconds) sum += s;
  return Summary{sum / static_cast<double>(seconds.size()) * 1e3, percentile(seconds, 50) * 1e3,
                 percentile(seconds, 99) * 1e3, seconds.back() * 1e3};
}

struct Report {
  int completed = 0, failed = 0;
  std::map<std::string, int> errors;               // label -> count
  std::map<std::string, std::string> first_error;  // label -> its first detail
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  std::optional<Summary> ttft, tpot, itl, e2el;
  std::optional<SlowCounts> slow;  // --slow-connections
};

Report summarize_run(const std::vector<CompletionTiming>& timings, double duration_s, bool stream) {
  Report r;
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const CompletionTiming& t : timings) {
    if (!t.error.empty()) {
      r.failed++;
      if (r.errors[t.error]++ == 0) r.first_error[t.error] = t.error_detail;
      continue;
    }
    r.completed++;
    r.input_tokens += t.prompt_tokens;
    r.output_tokens += t.output_tokens;
    e2el.push_back(t.e2e_s);
    if (stream) {
      if (t.ttft_s >= 0) ttft.push_back(t.ttft_s);
      if (t.output_tokens > 1) tpot.push_back((t.e2e_s - t.ttft_s) / (t.output_tokens - 1));
      itl.insert(itl.end(), t.itl_s.begin(), t.itl_s.end());
    } else if (t.output_tokens > 0) {
      tpot.push_back(t.e2e_s / t.output_tokens);
    }
  }
  r.ttft = summarize(std::move(ttft));
  r.tpot = summarize(std::move(tpot));
  r.itl = summarize(std::move(itl));
  r.e2el = summarize(std::move(e2el));
  return r;
}

std::string error_label(const std::string& label) {
  const bool status = !label.empty() && label[0] >= '0' && label[0] <= '9';
  return status ? "HTTP " + label : label;
}

void print_json(const ServeBenchArgs& a, const std::string& model, const Report& r) {
  using nlohmann::ordered_json;
  const bool rate = a.rate > 0;
  const double per_s = r.duration_s > 0 ? 1.0 / r.duration_s : 0.0;
  ordered_json j;
  j["url"] = a.url;
  j["model"] = model;
  j["stream"] = a.stream;
  j["mode"] = rate ? "rate" : "concurrency";
  j["concurrency"] = rate ? ordered_json(nullptr) : ordered_json(a.concurrency);
  j["request_rate"] = rate ? ordered_json(a.rate) : ordered_json(nullptr);
  j["max_in_flight"] = rate ? ordered_json(a.max_in_flight) : ordered_json(nullptr);
  j["requests"] = a.requests;
  j["prompt_tokens"] = a.prompt_tokens;
  j["shared_prefix"] = a.shared_prefix;
  j["max_tokens"] = a.max_tokens;
  j["warmup"] = a.warmup;
  j["seed"] = a.seed;
  j["completed"] = r.completed;
  j["failed"] = r.failed;
  j["errors"] = ordered_json::object();
  for (const auto& [label, n] : r.errors) j["errors"][label] = n;
  j["duration_s"] = r.duration_s;
  j["total_input_tokens"] = r.input_tokens;
  j["total_output_tokens"] = r.output_tokens;
  j["request_throughput"] = r.completed * per_s;
  j["output_throughput"] = static_cast<double>(r.output_tokens) * per_s;
  j["total_token_throughput"] = static_cast<double>(r.input_tokens + r.output_tokens) * per_s;
  for (const auto& [name, s] : {std::pair{"ttft", &r.ttft}, {"tpot", &r.tpot}, {"itl", &r.itl}, {"e2el", &r.e2el}}) {
    j[fmt::format("mean_{}_ms", name)] = *s ? ordered_json((*s)->mean_ms) : ordered_json(nullptr);
    j[fmt::format("p50_{}_ms", name)] = *s ? ordered_json((*s)->p50_ms) : ordered_json(nullptr);
    j[fmt::format("p99_{}_ms", name)] = *s ? ordered_json((*s)->p99_ms) : ordered_json(nullptr);
  }
  j["max_e2el_ms"] = r.e2el ? ordered_json(r.e2el->max_ms) : ordered_json(nullptr);
  j["duration_limit_s"] = a.duration_s > 0 ? ordered_json(a.duration_s) : ordered_json(nullptr);
  if (r.slow) {
    j["slow_connections"] = a.slow_connections;
    j["slow_opened"] = r.slow->opened;
    j["slow_closed_by_server"] = r.slow->closed_by_server;
    j["slow_answered_408"] = r.slow->answered_408;
    j["slow_answered_503"] = r.slow->answered_503;
    j["slow_failed_connects"] = r.slow->failed_connects;
  } else {
    j["slow_connections"] = 0;
  }
  std::printf("%s\n", j.dump().c_str());
}

void print_table(const ServeBenchArgs& a, const std::string& model, const Report& r) {
  const double per_s = r.duration_s > 0 ? 1.0 / r.duration_s : 0.0;
  const auto row = [](const std::string& name, const std::string& value) {
    std::printf("%-40s %s\n", name.c_str(), value.c_str());
  };
  std::printf("==================== tessera bench serve ====================\n");
  row("url", a.url);
  row("model", model);
  row("load", a.rate > 0 ? fmt::format("Poisson, {:g} req/s, at most {} in flight", a.rate, a.max_in_flight)
                         : fmt::format("closed loop, concurrency {}", a.concurrency));
  row("stream", a.stream ? "yes" : "no");
  row("successful requests", std::to_string(r.completed));
  row("failed requests", std::to_string(r.failed));
  for (const auto& [label, n] : r.errors) row("  errors: " + error_label(label), std::to_string(n));
  row("benchmark duration (s)", fmt::format("{:.2f}", r.duration_s));
  row("total input tokens", std::to_string(r.input_tokens));
  row("total output tokens", std::to_string(r.output_tokens));
  row("request throughput (req/s)", fmt::format("{:.2f}", r.completed * per_s));
  row("output token throughput (tok/s)", fmt::format("{:.2f}", static_cast<double>(r.output_tokens) * per_s));
  row("total token throughput (tok/s)",
      fmt::format("{:.2f}", static_cast<double>(r.input_tokens + r.output_tokens) * per_s));
  for (const auto& [name, s] :
       {std::pair{"TTFT", &r.ttft}, {"TPOT", &r.tpot}, {"ITL", &r.itl}, {"E2E latency", &r.e2el}}) {
    const auto value = [&](double Summary::*field) { return *s ? fmt::format("{:.2f}", (**s).*field) : "n/a"; };
    row(fmt::format("mean {} (ms)", name), value(&Summary::mean_ms));
    row(fmt::format("p50 {} (ms)", name), value(&Summary::p50_ms));
    row(fmt::format("p99 {} (ms)", name), value(&Summary::p99_ms));
  }
  row("max E2E latency (ms)", r.e2el ? fmt::format("{:.2f}", r.e2el->max_ms) : "n/a");
  if (r.slow) {
    row("slow connections held", std::to_string(a.slow_connections));
    row("  opened (reopenings included)", std::to_string(r.slow->opened));
    row("  closed by the server", fmt::format("{} ({} with 408, {} with 503)", r.slow->closed_by_server,
                                              r.slow->answered_408, r.slow->answered_503));
    row("  connects that failed", std::to_string(r.slow->failed_connects));
  }
}

int run_serve_bench(const ServeBenchArgs& a) {
  std::string model = a.model;
  SenderFactory make_sender;
  obs::Registry registry;
  std::unique_ptr<serve::Engine> engine;
  std::string target = a.url;
  if (!a.engine_model.empty()) {
    auto m = load_gpt2(a.engine_model, nullptr, Backend::kCPU, ModelUse::kInference);
    if (!m.ok()) return fail(m.status());
    (*m)->set_precision(a.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32);
    serve::EngineOptions eo;
    eo.max_seqs = a.max_seqs;
    eo.max_queue = a.requests + a.warmup;
    eo.max_batch_tokens = std::max(256, a.max_seqs);
    eo.queue_timeout_s = 1e6;
    auto e = serve::Engine::create(std::move(*m), eo, registry);
    if (!e.ok()) return fail(e.status());
    engine = std::move(*e);
    if (model.empty()) model = "engine";
    target = "engine:" + a.engine_model;
    serve::Engine* eng = engine.get();
    make_sender = [eng, &a] {
      return Sender([eng, &a](const CompletionRequest& r, int i) {
        return engine_complete(*eng, r, a.seed + static_cast<uint64_t>(i));
      });
    };
  } else {
    Result<ServeUrl> url = parse_serve_url(a.url);
    if (!url.ok()) {
      fail(url.status());
      return kExitUsage;  // a malformed flag, like CLI11's
    }
    // The first request: finds the model, or at least the server. Its
    // connection closes before the run.
    {
      CompletionClient probe(*url, ClientOptions{a.connect_timeout_s, a.timeout_s, a.api_key});
      if (model.empty()) {
        Result<std::string> m = probe.first_model();
        if (!m.ok()) return fail(m.status());
        model = *m;
      } else if (Status st = probe.reachable(); !st.ok()) {
        return fail(st);
      }
    }
    const ClientOptions options{a.connect_timeout_s, a.timeout_s, a.api_key};
    make_sender = [u = *url, options] {
      auto client = std::make_shared<CompletionClient>(u, options);
      return Sender([client](const CompletionRequest& r, int) { return client->complete(r); });
    };
  }
  const int workers = a.rate > 0 ? a.max_in_flight : a.concurrency;
  std::unique_ptr<SlowClients> slow;
  if (a.slow_connections > 0) {  // --url only (CLI11 refuses it with --engine)
    slow = std::make_unique<SlowClients>(*parse_serve_url(a.url), a.slow_connections, a.slow_interval_s);
    slow->start();
    std::fprintf(stderr, "bench serve: %d slow connections opened (%ld connects failed)\n", a.slow_connections,
                 slow->counts().failed_connects);
  }
  std::fprintf(stderr, "bench serve: %d requests (+%d warm-up) to %s, model %s, %d prompt + %d output tokens, %s\n",
               a.requests, a.warmup, target.c_str(), model.c_str(), a.prompt_tokens, a.max_tokens,
               a.stream ? "streamed" : "not streamed");
  double duration_s = 0;
  // Warm-up at --concurrency (1 with --rate): no burst of --max-in-flight.
  if (a.warmup > 0) run_requests(a, make_sender, model, a.requests, a.warmup, a.concurrency, {}, &duration_s);
  const std::vector<double> arrivals =
      a.rate > 0 ? poisson_arrivals(a.requests, a.rate, a.seed, a.duration_s) : std::vector<double>{};
  const int count = a.rate > 0 ? static_cast<int>(arrivals.size()) : a.requests;
  const std::vector<CompletionTiming> timings =
      run_requests(a, make_sender, model, 0, count, workers, arrivals, &duration_s);
  Report report = summarize_run(timings, duration_s, a.stream);
  if (slow) {
    slow->stop();
    report.slow = slow->counts();
  }
  for (const auto& [label, detail] : report.first_error)
    std::fprintf(stderr, "bench serve: %d request(s) failed with %s; the first: %s\n", report.errors.at(label),
                 error_label(label).c_str(), detail.c_str());
  if (a.json)
    print_json(a, model, report);
  else
    print_table(a, model, report);
  std::fflush(stdout);
  if (report.completed == 0)
    return fail(Status::Unavailable(fmt::format("all {} requests to {} failed", timings.size(), target)));
  return kExitOk;
}

}  // namespace

void add_bench_serve_command(CLI::App& bench) {
  auto a = std::make_shared<ServeBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "serve", "Load-test an OpenAI-compatible server: throughput, TTFT, TPOT, ITL and latency (as vLLM reports them)");
  CLI::Option* url = cmd->add_option("--url", a->url, "the server's root, http[s]://host[:port][/path]");
  CLI::Option* engine =
      cmd->add_option("--engine", a->engine_model,
                      "instead of --url: run the load in-process on this model (safetensors), without HTTP")
          ->check(CLI::ExistingFile);
  url->excludes(engine);
  cmd->add_option("--dtype", a->dtype, "with --engine: matmul precision")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--max-seqs", a->max_seqs, "with --engine: sequences batched at most")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--model", a->model, "model name (default: the first of GET {url}/v1/models)");
  CLI::Option* conc = cmd->add_option("--concurrency", a->concurrency, "requests in flight (closed loop)")
                          ->check(CLI::Range(1, 4096))
                          ->capture_default_str();
  CLI::Option* rate =
      cmd->add_option("--rate", a->rate, "Poisson arrivals, requests/s (open loop)")->check(CLI::PositiveNumber);
  conc->excludes(rate);
  cmd->add_option("--max-in-flight", a->max_in_flight, "with --rate: most requests outstanding at once")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--requests", a->requests, "timed requests")->check(CLI::Range(1, kMaxCount))->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "untimed requests first")
      ->check(CLI::Range(0, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--shared-prefix", a->shared_prefix,
                  "leading prompt tokens every request shares (a system prompt: what prefix caching reuses)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "prompt length, token ids")
      ->check(CLI::Range(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens, "tokens generated per request (ignore_eos)")
      ->check(CLI::Range(1, kMaxCount))
      ->capture_default_str();
  cmd->add_option("--temperature", a->temperature)->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--seed", a->seed, "prompts and arrival times")->capture_default_str();
  cmd->add_option("--api-key", a->api_key, "sent as Authorization: Bearer KEY");
  cmd->add_option("--timeout", a->timeout_s, "seconds one read (or write) may wait")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--connect-timeout", a->connect_timeout_s, "seconds to open a connection")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--duration", a->duration_s, "seconds: no new request after this (--requests stays the most)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--slow-connections", a->slow_connections,
                  "hold this many slowloris connections open during the run (a header line every --slow-interval)")
      ->check(CLI::Range(0, 60000))
      ->excludes(engine);
  cmd->add_option("--slow-interval", a->slow_interval_s, "seconds between a slow connection's header lines")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_flag("--stream", a->stream, "stream tokens (server-sent events): measures TTFT and ITL");
  cmd->add_flag("--json", a->json, "one JSON object on stdout instead of the table");
  cmd->callback([a, cmd] {
    if (a->url.empty() && a->engine_model.empty()) {
      fail(Status::InvalidArgument("bench serve needs --url (a server) or --engine (a model, in-process)"));
      exit_code() = kExitUsage;
      return;
    }
    exit_code() = run_serve_bench(*a);
  });
}

}  // namespace tessera::tools

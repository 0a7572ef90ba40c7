// The serving engine: continuous (iteration-level) batching of generation
// requests over one model and its PagedKVCache (nn/kv_cache.h), as vLLM's
// scheduler does it.
//
// A request is a prompt (token ids) and its sampling parameters. submit()
// queues it; one scheduler thread owns the model and the cache and runs a
// loop of steps. Each step:
//   1. takes in new requests and cancellations; refuses requests that waited
//      longer than queue_timeout_s (Unavailable);
//   2. admits waiting requests in arrival order while fewer than max_seqs run
//      and the pool has the blocks for the whole prompt (reserved at once, so
//      an admitted prompt never waits for blocks mid-prefill); with prefix
//      caching, the prompt's longest cached prefix comes from the cache
//      (full blocks keyed by their tokens and all before them, as vLLM) and
//      only the rest is prefilled; every full block computed is committed
//      for later requests;
//   3. builds one ragged batch (TokenBatch): one token for every sequence
//      that is decoding, then prefill chunks of the others in admission order
//      up to max_batch_tokens, so running sequences keep getting tokens while
//      a long prompt is read. A decoding sequence that needs a new block when
//      the pool is empty preempts the most recently admitted sequence (its
//      blocks are freed; it goes back to the head of the queue with its
//      generated tokens appended, and is recomputed when readmitted);
//   4. runs GPT::forward_tokens once, with logits only for the rows that end
//      a sequence's pending tokens;
//   5. samples a token for each of those sequences with the request's own
//      generator (std::mt19937_64 seeded by the request's seed), so a
//      request's output never depends on what else is in the batch: greedy is
//      exact up to the fp32 rounding of the logits, sampling with a seed is
//      reproducible, preempted or not;
//   6. retires finished sequences (end-of-text unless ignore_eos, max_tokens,
//      the model's context, a stop the caller signalled, a cancellation) and
//      gives their blocks back.
//
// Callbacks (RequestSink) run on the scheduler thread and must be quick
// (append to a buffer, notify); on_finish is called exactly once per
// accepted request, whatever happens, also at shutdown.
//
// Metrics go to an obs::Registry under vLLM's names with a tessera_ prefix
// (docs/serving.md lists them).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/status.h"
#include "nn/gpt.h"
#include "nn/kv_cache.h"
#include "obs/metrics.h"

namespace tessera::serve {

struct SamplingParams {
  int max_tokens = 16;       // >= 1
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: all
  uint64_t seed = 0;
  bool ignore_eos = false;   // keep generating after end-of-text (benchmarks)
  int logprobs = -1;         // -1: none; 0..20: the token's log-probability and this many alternatives
};

// A model's own sampling defaults (generation_config.json's temperature,
// top_p, top_k, as vLLM takes them), used for the fields a request leaves
// out; unset ones keep SamplingParams' (and OpenAI's) defaults.
struct SamplingDefaults {
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
std::string_view finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct TokenEvent {
  int token = 0;
  bool last = false;  // the request ends with this token (max_tokens or the context reached)
  float logprob = 0.0f;                    // when logprobs >= 0
  std::vector<std::pair<int, float>> top;  // the logprobs most likely ids, most likely first
};

struct RequestResult {
  FinishReason reason = FinishReason::kStop;
  Status status;  // not OK for kError, and for a request refused after queueing (Unavailable)
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int preemptions = 0;
};

struct RequestSink {
  // Called once the request holds a place in the running batch (not again
  // after a preemption). May be empty.
  std::function<void()> on_admitted;
  // Each generated token, in order (end-of-text is not reported). Return
  // false to end the request here with finish reason "stop" (a stop string).
  std::function<bool(const TokenEvent&)> on_token;
  std::function<void(const RequestResult&)> on_finish;
};

struct EngineOptions {
  int max_seqs = 32;            // sequences running at once
  int max_queue = 256;          // requests waiting (not yet admitted)
  int kv_blocks = 0;            // blocks in the pool; 0: max_seqs full contexts
  int block_size = PagedKVCache::kDefaultBlockSize;
  KvDtype kv_dtype = KvDtype::kF32;  // the cache's element type (f16: CPU only)
  int max_batch_tokens = 256;   // tokens per step; >= max_seqs
  double queue_timeout_s = 60;  // a request not admitted by then is refused
  int eot_token = -1;           // end-of-text id; -1: none
  // More ids that end a generation (a model's generation_config.json
  // eos_token_id list: Llama 3 has several), besides eot_token.
  std::vector<int> stop_tokens;
  // Automatic prefix caching (nn/kv_cache.h): a request's prompt reuses the
  // cached blocks of its longest cached prefix and prefills the rest.
  bool prefix_cache = true;
};

struct EngineStats {
  int running = 0, waiting = 0;
  int kv_used_blocks = 0, kv_blocks = 0;
  int kv_cached_blocks = 0;                            // prefix-cache blocks, held or evictable
  int64_t prefix_queries = 0, prefix_hits = 0;         // prompt tokens looked up, and found cached
  int64_t steps = 0, preemptions = 0;
};

class Engine {
 public:
  // Takes the model (loaded for inference). InvalidArgument for options out
  // of range; the cache pool's allocation status otherwise. Starts the
  // scheduler thread.
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<GPT> model, const EngineOptions& opts,
                                                obs::Registry& registry);
  // Finishes every request still queued or running with kCancelled, then
  // stops the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request and returns its id. InvalidArgument: empty prompt, an
  // id outside the vocabulary, a prompt that leaves no room for one token in
  // the context, or one that could not fit in the whole pool, parameters out
  // of range. ResourceExhausted: max_queue requests are waiting beyond the
  // places free in the running batch.
  // Unavailable: draining or stopped. On error no callback is ever called.
  Result<uint64_t> submit(std::vector<int> prompt, const SamplingParams& params, RequestSink sink);
  // Ends the request at the next step (on_finish with kCancelled). Unknown or
  // finished ids are ignored. Any thread.
  void cancel(uint64_t id);
  // Refuses new requests from now on (Unavailable), waits up to timeout_s for
  // the queued and running ones to finish, then cancels what is left. Returns
  // whether everything finished in time.
  bool drain(double timeout_s);
  bool draining() const { return draining_.load(); }
  // A device fault: once the model fails a step (a CUDA or NCCL error), the
  // engine ends every queued and running request with that status and
  // refuses new ones (Unavailable naming it) until set_fault(OK). The server
  // reports it on /health. set_fault(error) injects one (fault drills).
  Status fault() const;
  void set_fault(Status st);

  EngineStats stats() const;
  const GPT& model() const { return *model_; }
  const EngineOptions& options() const { return opts_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Seq;
  struct Metrics;

  Engine(std::unique_ptr<GPT> model, const EngineOptions& opts, obs::Registry& registry);
  void loop();
  void step();
  void take_inbox();
  bool admit(Seq& s);
  void preempt(size_t index);
  void finish(Seq& s, FinishReason reason, Status status = Status::OK());
  void sample(Seq& s, const float* logits);
  void update_gauges();

  std::unique_ptr<GPT> model_;
  EngineOptions opts_;
  std::unique_ptr<PagedKVCache> cache_;
  std::unique_ptr<Metrics> metrics_;

  // Shared with submitters, under mu_.
  mutable std::mutex mu_;
  std::condition_variable wake_;  // the scheduler: work arrived, or stop
  std::condition_variable idle_;  // drain(): nothing queued or running
  std::deque<std::unique_ptr<Seq>> inbox_;
  std::unordered_set<uint64_t> cancels_;
  int queued_ = 0;   // inbox_ + waiting_
  int running_count_ = 0;  // running_.size(), for submit()
  int active_ = 0;   // accepted and not yet finished
  uint64_t next_id_ = 1;
  bool stop_ = false;
  Status fault_;
  std::atomic<bool> draining_{false};
  EngineStats stats_;

  // The scheduler thread's own.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // admission order
  std::vector<int> batch_tokens_, batch_seq_, batch_pos_, logit_rows_;
  std::vector<Seq*> logit_seqs_;
  std::vector<float> logits_;

  std::thread thread_;
};

}  // namespace tessera::serve

#include "serve/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "core/check.h"
#include "nn/sampler.h"

namespace tessera::serve {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

struct Engine::Seq {
  uint64_t id = 0;
  std::vector<int> tokens;  // the prompt, then every token generated
  int prompt_len = 0;
  int generated = 0;
  int computed = 0;    // leading tokens whose keys and values are in the cache
  int cache_seq = -1;  // PagedKVCache sequence while running
  bool admitted_once = false;
  int preemptions = 0;
  SamplingParams params;
  std::mt19937_64 rng;
  RequestSink sink;
  Clock::time_point arrival, last_token;
  bool finished = false;
};

struct Engine::Metrics {
  obs::Gauge* running;
  obs::Gauge* waiting;
  obs::Gauge* kv_usage;
  obs::Counter* prompt_tokens;
  obs::Counter* generation_tokens;
  obs::Counter* preemptions;
  obs::Counter* prefix_queries;
  obs::Counter* prefix_hits;
  obs::Gauge* prefix_blocks;
  obs::Histogram* ttft;
  obs::Histogram* itl;
  obs::Histogram* e2e;
  obs::Histogram* queue;
  obs::Histogram* batch_tokens;
  obs::Registry* registry;
};

Engine::Engine(std::unique_ptr<GPT> model, const EngineOptions& opts, obs::Registry& r)
    : model_(std::move(model)), opts_(opts), metrics_(std::make_unique<Metrics>()) {
  Metrics& m = *metrics_;
  m.registry = &r;
  m.running = &r.gauge("tessera_requests_running", "Requests in the running batch");
  m.waiting = &r.gauge("tessera_requests_waiting", "Requests queued, not yet admitted");
  m.kv_usage = &r.gauge("tessera_kv_cache_usage_ratio", "Fraction of the KV-cache blocks in use (0 to 1)");
  m.prompt_tokens = &r.counter("tessera_prompt_tokens_total", "Prompt tokens prefilled (recomputation included)");
  m.generation_tokens = &r.counter("tessera_generation_tokens_total", "Tokens generated");
  m.preemptions = &r.counter("tessera_preemptions_total", "Sequences preempted for lack of KV-cache blocks");
  m.prefix_queries = &r.counter("tessera_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache");
  m.prefix_hits = &r.counter("tessera_prefix_cache_hits_total", "Prompt tokens found in the prefix cache");
  m.prefix_blocks = &r.gauge("tessera_prefix_cache_blocks", "KV-cache blocks holding a cached prefix");
  const std::vector<double> latency = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
                                       0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10,   20,   40,  80};
  m.ttft = &r.histogram("tessera_time_to_first_token_seconds", "Time from arrival to the first token", latency);
  m.itl = &r.histogram("tessera_inter_token_latency_seconds", "Time between consecutive tokens of a request",
                       latency);
  m.e2e = &r.histogram("tessera_e2e_request_latency_seconds", "Time from arrival to the last token", latency);
  m.queue = &r.histogram("tessera_request_queue_time_seconds", "Time from arrival to admission", latency);
  m.batch_tokens = &r.histogram("tessera_batch_tokens", "Tokens in one step's ragged batch",
                                obs::exponential_buckets(1, 2, 12));
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<GPT> model, const EngineOptions& opts,
                                               obs::Registry& registry) {
  if (!model) return Status::InvalidArgument("the engine needs a model");
  if (opts.max_seqs < 1) return Status::InvalidArgument(fmt::format("max_seqs must be >= 1, got {}", opts.max_seqs));
  if (opts.max_queue < 0)
    return Status::InvalidArgument(fmt::format("max_queue must be >= 0, got {}", opts.max_queue));
  if (opts.block_size < 1)
    return Status::InvalidArgument(fmt::format("block_size must be >= 1, got {}", opts.block_size));
  if (opts.max_batch_tokens < opts.max_seqs)
    return Status::InvalidArgument(fmt::format(
        "max_batch_tokens ({}) must be at least max_seqs ({}): every running sequence gets a token each step",
        opts.max_batch_tokens, opts.max_seqs));
  if (opts.kv_blocks < 0)
    return Status::InvalidArgument(fmt::format("kv_blocks must be >= 0, got {}", opts.kv_blocks));
  if (!(opts.queue_timeout_s > 0))
    return Status::InvalidArgument(fmt::format("queue_timeout_s must be > 0, got {}", opts.queue_timeout_s));
  const GPTConfig& c = model->config();
  if (opts.eot_token >= c.vocab)
    return Status::InvalidArgument(
        fmt::format("end-of-text id {} is outside the model's vocabulary of {}", opts.eot_token, c.vocab));
  for (int t : opts.stop_tokens)
    if (t < 0 || t >= c.vocab)
      return Status::InvalidArgument(fmt::format("stop token id {} is outside the model's vocabulary of {}", t, c.vocab));
  EngineOptions o = opts;
  const int per_seq = (c.context + o.block_size - 1) / o.block_size;
  if (o.kv_blocks == 0) o.kv_blocks = o.max_seqs * per_seq;
  std::unique_ptr<Engine> e(new Engine(std::move(model), o, registry));
  ASSIGN_OR_RETURN(e->cache_, PagedKVCache::create(*e->model_, o.kv_blocks, o.block_size, o.max_seqs, o.kv_dtype));
  e->logits_.resize(static_cast<size_t>(o.max_seqs) * c.padded_vocab());
  e->stats_.kv_blocks = o.kv_blocks;
  e->update_gauges();
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  return e;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    draining_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<uint64_t> Engine::submit(std::vector<int> prompt, const SamplingParams& p, RequestSink sink) {
  const GPTConfig& c = model_->config();
  const int P = static_cast<int>(prompt.size());
  if (P == 0) return Status::InvalidArgument("the prompt is empty");
  for (int i = 0; i < P; i++) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab)
      return Status::InvalidArgument(
          fmt::format("prompt token {} (at {}) is outside the vocabulary [0, {})", prompt[i], i, c.vocab));
  }
  if (P >= c.context)
    return Status::InvalidArgument(fmt::format(
        "the prompt is {} tokens; the model's context is {}, which leaves no room to generate", P, c.context));
  if (p.max_tokens < 1) return Status::InvalidArgument(fmt::format("max_tokens must be >= 1, got {}", p.max_tokens));
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return Status::InvalidArgument(fmt::format("temperature must be finite and >= 0, got {}", p.temperature));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return Status::InvalidArgument(fmt::format("top_p must be in (0, 1], got {}", p.top_p));
  if (p.top_k < 0) return Status::InvalidArgument(fmt::format("top_k must be >= 0, got {}", p.top_k));
  if (p.logprobs > 20) return Status::InvalidArgument(fmt::format("logprobs must be <= 20, got {}", p.logprobs));
  // The longest this sequence can get, and the pool's room for it alone.
  const int longest = static_cast<int>(std::min<int64_t>(c.context, int64_t{P} + p.max_tokens));
  if (cache_->blocks_needed(longest) > opts_.kv_blocks)
    return Status::InvalidArgument(fmt::format(
        "the prompt ({} tokens) plus max_tokens ({}) needs {} KV-cache blocks of {} positions; the pool has {}", P,
        p.max_tokens, cache_->blocks_needed(longest), opts_.block_size, opts_.kv_blocks));

  auto s = std::make_unique<Seq>();
  s->prompt_len = P;
  s->tokens = std::move(prompt);
  s->tokens.reserve(longest);
  s->params = p;
  s->rng.seed(p.seed);
  s->sink = std::move(sink);
  s->arrival = Clock::now();
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stop_) return Status::Unavailable("the server is shutting down");
    if (!fault_.ok()) return Status::Unavailable(fmt::format("device error: {}", fault_.message()));
    // Requests that will be admitted at the next step do not count as waiting.
    const int free_places = opts_.max_seqs - running_count_;
    if (queued_ - free_places >= opts_.max_queue)
      return Status::ResourceExhausted(
          fmt::format("the queue is full ({} requests waiting, --max-queue {})", queued_, opts_.max_queue));
    id = next_id_++;
    s->id = id;
    inbox_.push_back(std::move(s));
    queued_++;
    active_++;
  }
  wake_.notify_one();
  return id;
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.insert(id);
  }
  wake_.notify_one();
}

bool Engine::drain(double timeout_s) {
  draining_ = true;
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = idle_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return active_ == 0; });
  if (!done) {
    stop_ = true;  // the loop cancels what is left, then exits
    wake_.notify_all();
    idle_.wait(lock, [&] { return active_ == 0; });
  }
  return done;
}

Status Engine::fault() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fault_;
}

void Engine::set_fault(Status st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fault_ = std::move(st);
  }
  wake_.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::update_gauges() {
  const int used = cache_->used_blocks();
  metrics_->running->set(static_cast<double>(running_.size()));
  metrics_->prefix_blocks->set(cache_->cached_blocks());
  metrics_->kv_usage->set(static_cast<double>(used) / opts_.kv_blocks);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = running_count_;
  stats_.waiting = queued_;
  stats_.kv_used_blocks = used;
  stats_.kv_cached_blocks = cache_->cached_blocks();
  metrics_->waiting->set(queued_);
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return stop_ || !inbox_.empty() || !cancels_.empty() || !waiting_.empty() || !running_.empty();
      });
      if (stop_) break;
    }
    step();
  }
  // Stopped: whatever is left ends as cancelled.
  take_inbox();
  for (auto& s : running_) finish(*s, FinishReason::kCancelled, Status::Unavailable("the server stopped"));
  for (auto& s : waiting_) finish(*s, FinishReason::kCancelled, Status::Unavailable("the server stopped"));
  running_.clear();
  waiting_.clear();
  update_gauges();
}

void Engine::take_inbox() {
  std::unordered_set<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!inbox_.empty()) {
      waiting_.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
    cancels.swap(cancels_);
  }
  if (cancels.empty()) return;
  for (auto& s : running_) {
    if (cancels.count(s->id)) finish(*s, FinishReason::kCancelled);
  }
  for (auto& s : waiting_) {
    if (cancels.count(s->id)) finish(*s, FinishReason::kCancelled);
  }
}

void Engine::finish(Seq& s, FinishReason reason, Status status) {
  if (s.finished) return;
  s.finished = true;
  const bool was_waiting = s.cache_seq < 0;
  if (s.cache_seq >= 0) {
    cache_->release(s.cache_seq);
    s.cache_seq = -1;
  }
  RequestResult r;
  r.reason = reason;
  r.status = std::move(status);
  r.prompt_tokens = s.prompt_len;
  r.completion_tokens = s.generated;
  r.preemptions = s.preemptions;
  if (s.generated > 0)
    metrics_->e2e->observe(std::chrono::duration<double>(s.last_token - s.arrival).count());
  {
    // The counts first, so that a caller woken by on_finish sees them.
    std::lock_guard<std::mutex> lock(mu_);
    if (was_waiting) {
      queued_--;
    } else {
      running_count_--;
    }
    stats_.kv_used_blocks = cache_->used_blocks();
    stats_.running = running_count_;
    stats_.waiting = queued_;
  }
  if (s.sink.on_finish) s.sink.on_finish(r);
  std::lock_guard<std::mutex> lock(mu_);
  active_--;
  if (active_ == 0) idle_.notify_all();
}

bool Engine::admit(Seq& s) {
  // Blocks for every token not yet computed, and one for the next.
  const int L = static_cast<int>(s.tokens.size());
  Result<int> seq = cache_->add_sequence();
  if (!seq.ok()) return false;
  const int cached = opts_.prefix_cache ? cache_->match_prefix(*seq, s.tokens) : 0;
  if (cache_->free_blocks() < cache_->blocks_needed(L) - cached / opts_.block_size) {
    cache_->release(*seq);  // the matched blocks go back to the cache
    return false;
  }
  Status st = cache_->extend(*seq, L - cached);
  if (!st.ok()) {
    cache_->release(*seq);
    return false;
  }
  s.cache_seq = *seq;
  s.computed = cached;
  if (opts_.prefix_cache) {
    metrics_->prefix_queries->add(L);
    metrics_->prefix_hits->add(cached);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prefix_queries += L;
    stats_.prefix_hits += cached;
  }
  if (!s.admitted_once) {
    s.admitted_once = true;
    metrics_->queue->observe(std::chrono::duration<double>(Clock::now() - s.arrival).count());
    if (s.sink.on_admitted) s.sink.on_admitted();
  }
  return true;
}

// running_[index] goes back to the head of the queue; its tokens (prompt and
// generated) are recomputed when it is admitted again.
void Engine::preempt(size_t index) {
  std::unique_ptr<Seq> s = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  cache_->release(s->cache_seq);
  s->cache_seq = -1;
  s->computed = 0;
  s->preemptions++;
  metrics_->preemptions->add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_++;
    running_count_--;
    stats_.preemptions++;
  }
  waiting_.push_front(std::move(s));
}

void Engine::sample(Seq& s, const float* logits) {
  const int V = model_->config().vocab;
  const SamplingParams& p = s.params;
  const int token = sample_token(logits, V, p.temperature, p.top_k, p.top_p, s.rng);
  const Clock::time_point now = Clock::now();
  if (s.generated == 0) {
    metrics_->ttft->observe(std::chrono::duration<double>(now - s.arrival).count());
  } else {
    metrics_->itl->observe(std::chrono::duration<double>(now - s.last_token).count());
  }
  s.last_token = now;
  s.tokens.push_back(token);
  s.generated++;
  metrics_->generation_tokens->add(1);
  if ((token == opts_.eot_token ||
       std::find(opts_.stop_tokens.begin(), opts_.stop_tokens.end(), token) != opts_.stop_tokens.end()) &&
      !p.ignore_eos) {
    finish(s, FinishReason::kStop);
    return;
  }
  const bool length = s.generated >= p.max_tokens || static_cast<int>(s.tokens.size()) >= model_->config().context;
  TokenEvent ev;
  ev.token = token;
  ev.last = length;
  if (p.logprobs >= 0) {
    ev.logprob = token_logprob(logits, V, token);
    if (p.logprobs > 0) {
      std::vector<int> ids(V);
      for (int j = 0; j < V; j++) ids[j] = j;
      const int k = std::min(p.logprobs, V);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [logits](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      const float shift = ev.logprob - logits[token];  // log-softmax = logit + shift
      for (int j = 0; j < k; j++) ev.top.emplace_back(ids[j], logits[ids[j]] + shift);
    }
  }
  const bool go_on = !s.sink.on_token || s.sink.on_token(ev);
  if (!go_on) {
    finish(s, FinishReason::kStop);
  } else if (length) {
    finish(s, FinishReason::kLength);
  }
}

void Engine::step() {
  take_inbox();
  Status fault;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fault = fault_;
  }
  if (!fault.ok()) {
    const Status st = Status::Unavailable(fmt::format("device error: {}", fault.message()));
    for (auto& s : running_) finish(*s, FinishReason::kError, st);
    for (auto& s : waiting_) finish(*s, FinishReason::kError, st);
    running_.clear();
    waiting_.clear();
    update_gauges();
    return;
  }
  // Refuse requests that waited too long; drop finished ones.
  const Clock::time_point now = Clock::now();
  for (auto& s : waiting_) {
    // Only requests never admitted: a preempted one waits again, but has
    // been served (it resumes, never times out).
    if (!s->finished && !s->admitted_once &&
        std::chrono::duration<double>(now - s->arrival).count() > opts_.queue_timeout_s)
      finish(*s, FinishReason::kError,
             Status::Unavailable(fmt::format("the request waited more than {} s for a place in the batch",
                                             opts_.queue_timeout_s)));
  }
  std::erase_if(waiting_, [](const auto& s) { return s->finished; });
  std::erase_if(running_, [](const auto& s) { return s->finished; });

  // Admission, in arrival order.
  while (!waiting_.empty() && static_cast<int>(running_.size()) < opts_.max_seqs) {
    Seq& s = *waiting_.front();
    if (!admit(s)) break;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_--;
      running_count_++;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (running_.empty()) {
    update_gauges();
    return;
  }

  // Room for one more position for every decoding sequence (its last token
  // sampled, not yet fed), preempting the newest sequences when the pool is
  // out of blocks.
  for (size_t i = 0; i < running_.size();) {
    Seq& s = *running_[i];
    const int want = static_cast<int>(s.tokens.size());
    if (cache_->length(s.cache_seq) >= want) {
      i++;
      continue;
    }
    Status st = cache_->extend(s.cache_seq, want - cache_->length(s.cache_seq));
    if (st.ok()) {
      i++;
      continue;
    }
    if (st.code() != StatusCode::kResourceExhausted) {
      finish(s, FinishReason::kError, st);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    // Out of blocks: the newest sequence gives its blocks up (possibly this one).
    preempt(running_.size() - 1);
  }
  if (running_.empty()) {
    update_gauges();
    return;
  }

  // The batch: decodes first (one token each), then prefill chunks.
  batch_tokens_.clear();
  batch_seq_.clear();
  batch_pos_.clear();
  logit_rows_.clear();
  logit_seqs_.clear();
  int budget = opts_.max_batch_tokens;
  int64_t prefill = 0;
  auto schedule = [&](Seq& s, int n) {
    for (int j = 0; j < n; j++) {
      batch_tokens_.push_back(s.tokens[s.computed + j]);
      batch_seq_.push_back(s.cache_seq);
      batch_pos_.push_back(s.computed + j);
    }
    s.computed += n;
    budget -= n;
    if (s.computed == static_cast<int>(s.tokens.size())) {
      logit_rows_.push_back(static_cast<int>(batch_tokens_.size()) - 1);
      logit_seqs_.push_back(&s);
    }
  };
  for (auto& s : running_) {
    if (static_cast<int>(s->tokens.size()) - s->computed == 1 && s->generated > 0) schedule(*s, 1);
  }
  for (auto& s : running_) {
    const int pending = static_cast<int>(s->tokens.size()) - s->computed;
    if (pending == 0 || (pending == 1 && s->generated > 0)) continue;
    if (budget <= 0) break;
    const int n = std::min(pending, budget);
    prefill += n;
    schedule(*s, n);
  }
  metrics_->prompt_tokens->add(static_cast<double>(prefill));
  metrics_->batch_tokens->observe(static_cast<double>(batch_tokens_.size()));

  const TokenBatch b{batch_tokens_, batch_seq_, batch_pos_};
  Status st = model_->forward_tokens(b, *cache_, logit_rows_, logits_.data());
  if (!st.ok()) {
    // The model failed (a device error): every sequence ends, and the
    // engine refuses work until cleared (the server's /health says why).
    std::fprintf(stderr, "serve: device error: %s; refusing new requests\n", st.ToString().c_str());
    set_fault(st);
    for (auto& s : running_) finish(*s, FinishReason::kError, st);
    running_.clear();
    update_gauges();
    return;
  }
  // The full blocks just computed become cached prefixes (before sampling,
  // which may finish a sequence and release its blocks).
  if (opts_.prefix_cache) {
    for (auto& s : running_) cache_->commit(s->cache_seq, s->tokens, s->computed);
  }
  const int64_t Vp = model_->config().padded_vocab();
  for (size_t r = 0; r < logit_seqs_.size(); r++) sample(*logit_seqs_[r], logits_.data() + r * Vp);
  std::erase_if(running_, [](const auto& s) { return s->finished; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps++;
  }
  update_gauges();
}

}  // namespace tessera::serve

// tessera bench decode: the speed of the serving forward (GPT::forward_tokens
// over a paged KV cache) decoding 1, 8, 32, ... sequences together, against
// the memory-bandwidth limit of this machine, and the resident memory of a
// model loaded for inference.
//
// Decode reads every weight once per step whatever the batch, so one step
// takes at least weight_bytes / bandwidth: the limit is batch * bandwidth /
// weight_bytes tokens/s (of_limit: the fraction reached). Each sequence
// also reads its keys and values: of_roof counts those bytes too (the
// roofline of the whole step). Bandwidth is the read roof measured here
// (perf::read_gb_per_s: all threads streaming a 256 MB buffer, reads only,
// as 8, 1 or 4 streams a thread in turn, best of 20) before the model is
// loaded; the STREAM triad is printed
// beside it. The host's roof moves from minute to minute (33-66 GB/s on
// a shared 2-vCPU Zen 4), so when the weights are 4 x the
// last-level cache the roof is measured again right after each batch's
// decode, over the weights themselves (perf::read_gb_per_s_over: nothing
// allocated, the process's peak memory stays the model's), and of_limit and
// of_roof are against that one.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/try.h"
#include "kernels/cpu/int8_kernel.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "nn/kv_cache.h"
#include "nn/ops_table.h"
#include "obs/op_timer.h"
#include "perf/cpu_checks.h"
#include "plan/model.h"
#include "serve/model_assets.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct DecodeArgs {
  GPTConfig model{12, 12, 768, 50257, 1024};
  std::string preset;      // a planner preset's shape instead of the flags
  std::string model_dir;   // a Hugging Face folder's weights and shape
  int kv_heads = 0, mlp_hidden = 0;  // overrides of a preset
  std::vector<int> batches{1, 8, 32};
  int prompt = 128;
  int tokens = 32;
  int block_size = PagedKVCache::kDefaultBlockSize;
  std::string dtype = "fp32";
  std::string int8_kernel = "auto";
  bool ops = false;  // --ops: time each kind of op of a decode step
  bool paired_roof = false;  // --paired-roof: the roof read after every timed step
  std::string kv_dtype = "fp32";
  // Prefill rows a forward: the prompts go through in chunks of this many
  // rows, in order, as the server's steps (max_batch_tokens) and
  // llama.cpp's micro-batches (n_ubatch, 512) take them; the scratch and
  // the process's peak memory follow the chunk, not the whole prompt.
  int prefill_chunk = 512;
};

// Resident set size of this process (VmRSS), bytes; 0 if unknown.
int64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream in(line.substr(6));
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// Resets the peak resident mark (VmHWM) to the present resident set
// (proc(5), /proc/PID/clear_refs "5"); a kernel without it keeps the mark.
void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

// The read roof and the STREAM triad, bytes/s (perf/cpu_checks.h), best
// of 20 (a noisy host). Buffers of 256 and 192 MB: over twice the largest
// last-level cache of these machines (105 MB), and measured before the model
// is loaded (run_decode_bench), so they are not resident beside it.
double read_bandwidth() { return perf::read_gb_per_s(int64_t{1} << 25, 20) * 1e9; }
double triad_bandwidth() { return perf::triad_gb_per_s(int64_t{1} << 24) * 1e9; }

int run_decode_bench(const DecodeArgs& args) {
  DecodeArgs a = args;
  if (!a.preset.empty()) {
    if (!a.model_dir.empty()) return fail(Status::InvalidArgument("give --preset or --model, not both"));
    auto p = plan::model_preset(a.preset);
    if (!p.ok()) return fail(p.status());
    const int context = a.model.context;
    a.model = p->shape();
    a.model.context = std::min(a.model.context, std::max(context, a.prompt + a.tokens));
  }
  if (a.kv_heads) a.model.kv_heads = a.kv_heads;
  if (a.mlp_hidden) a.model.mlp_hidden = a.mlp_hidden;
  // The limit is the read roof (issue #31 item 1): a decode step only reads
  // its weights; the triad also writes, and is printed beside it. Both
  // before the model is loaded, so their buffers (freed on return) are not
  // resident beside it, and the peak resident mark is reset after them:
  // the process's peak memory (VmHWM, and getrusage's ru_maxrss that
  // /usr/bin/time prints) is the model's, not the 256 MB buffer's, which
  // was GPT-2 int8's whole peak.
  const double triad = triad_bandwidth();
  const double bandwidth = read_bandwidth();
  reset_peak_rss();
  const int64_t rss0 = rss_bytes();
  // --ops: the CPU kernels through timed thunks (nn/ops_table.h, op_timer.h).
  const Backend backend = a.ops ? Backend::kCPUProfiled : Backend::kCPU;
  std::unique_ptr<GPT> loaded;
  if (!a.model_dir.empty()) {
    // The folder's weights: int8 quantized tensor by tensor as they are read.
    auto m = load_gpt2(a.model_dir, nullptr, backend,
                       a.dtype == "int8" ? ModelUse::kInt8Inference : ModelUse::kInference);
    if (!m.ok()) return fail(m.status());
    loaded = std::move(m).value();
    a.model = loaded->config();
  }
  if (Status st = a.model.validate(); !st.ok()) return fail(st);
  if (a.prompt < 1 || a.tokens < 1 || a.prompt + a.tokens > a.model.context)
    return fail(Status::InvalidArgument(fmt::format("--prompt {} + --tokens {} must fit in --context {}", a.prompt,
                                                    a.tokens, a.model.context)));
  if (Status st = apply_int8_kernel(a.int8_kernel); !st.ok()) return fail(st);
  if (!loaded) {
    Result<std::unique_ptr<GPT>> made =
        GPT::create(a.model, backend, ModelShard{}, nullptr, ModelUse::kInference);
    if (!made.ok()) return fail(made.status());
    loaded = std::move(made).value();
    if (Status st = loaded->init_weights(1234); !st.ok()) return fail(st);
  }
  GPT& model = *loaded;
  model.set_precision(a.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32);
  if (a.dtype == "int8" && !model.int8()) {
    // As tessera serve --dtype int8 does with a checkpoint: the fp32 matmul
    // weights are given back.
    if (Status st = model.quantize_int8(); !st.ok()) return fail(st);
    if (Status st = model.release_fp32_matmul_weights().status(); !st.ok()) return fail(st);
    std::fprintf(stderr, "int8 matmul: %s\n", cpu::int8_kernel_info().summary.c_str());
  }
  if (Status st = serve::apply_int4_dtype(model, a.dtype, "bench decode", true); !st.ok()) return fail(st);
  // As the server's weights are (serve::apply_inference_dtype).
  const int64_t huge_bytes = serve::weights_to_huge_pages(model, "bench decode");
  const int64_t rss_model = rss_bytes();
  // Bytes a decode step reads: the matmul weights (int8 when quantized) and
  // the norms; an untied model reads only B rows of its embedding table.
  const int64_t embed_bytes =
      a.model.tied_head ? 0 : static_cast<int64_t>(model.params().tensor(kWte).nbytes());
  const int64_t weight_bytes = a.dtype == "int8" ? model.int8_bytes()
                               : model.int4()    ? model.q4_bytes()
                                                 : static_cast<int64_t>(model.params().bytes()) - embed_bytes;
  const int Vp = a.model.padded_vocab();
  // The weights a step streams, for the roof after each batch: when they
  // are at least 4 x the last-level cache (else the roof before loading:
  // GPT-2 int4, 70 MB, read at 105 GB/s over a 32 MB L3, partly from it).
  std::vector<perf::ReadBlock> weight_blocks;
  for (std::span<const uint8_t> b : model.stored_weights()) weight_blocks.push_back({b.data(), b.size()});
  if (weight_bytes < 4 * perf::last_level_cache_bytes()) weight_blocks.clear();
  std::fprintf(stderr,
               "model %s: weights %.1f MB, resident %.1f MB after loading; read roof %.1f GB/s (triad %.1f GB/s)\n",
               a.model.str().c_str(), weight_bytes / 1e6, (rss_model - rss0) / 1e6, bandwidth / 1e9, triad / 1e9);

  Result<KvDtype> kv_dtype = parse_kv_dtype(a.kv_dtype);
  if (!kv_dtype.ok()) return fail(kv_dtype.status());
  {
    // One untimed prefill of a prompt (its own cache, freed after), as
    // llama.cpp's batched-bench decodes 16 tokens before it times anything:
    // the first forward of a process also creates oneDNN's primitives for
    // its shapes (GPT-2 fp32 prefill under AVX2: 643-836 tokens/s timed
    // from the first forward, against 800-870 for llama.cpp).
    const int n = std::min(a.prompt, a.prefill_chunk);
    Result<std::unique_ptr<PagedKVCache>> warm =
        PagedKVCache::create(model, (n + a.block_size - 1) / a.block_size, a.block_size, 1, *kv_dtype);
    if (!warm.ok()) return fail(warm.status());
    Result<int> id = (*warm)->add_sequence();
    if (!id.ok()) return fail(id.status());
    if (Status st = (*warm)->extend(*id, n); !st.ok()) return fail(st);
    std::vector<int> tok(n), seq(n, *id), pos(n);
    for (int p = 0; p < n; p++) tok[p] = p % a.model.vocab, pos[p] = p;
    const std::vector<int> last = {n - 1};
    std::vector<float> logits(static_cast<size_t>(Vp));
    if (Status st = model.forward_tokens(TokenBatch{tok, seq, pos}, **warm, last, logits.data()); !st.ok())
      return fail(st);
  }
  for (const int B : a.batches) {
    const int per_seq = (a.prompt + a.tokens + a.block_size - 1) / a.block_size;
    Result<std::unique_ptr<PagedKVCache>> made_cache =
        PagedKVCache::create(model, B * per_seq, a.block_size, std::max(B, 1), *kv_dtype);
    if (!made_cache.ok()) return fail(made_cache.status());
    PagedKVCache& cache = **made_cache;
    std::mt19937 rng(7);
    std::vector<int> ids(B);
    for (int b = 0; b < B; b++) {
      Result<int> id = cache.add_sequence();
      if (!id.ok()) return fail(id.status());
      ids[b] = *id;
    }
    // Prefill: every prompt in one ragged batch, logits of each last row.
    std::vector<int> tok, seq, pos, rows;
    for (int b = 0; b < B; b++) {
      if (Status st = cache.extend(ids[b], a.prompt); !st.ok()) return fail(st);
      for (int p = 0; p < a.prompt; p++) {
        tok.push_back(static_cast<int>(rng() % a.model.vocab));
        seq.push_back(ids[b]);
        pos.push_back(p);
      }
      rows.push_back(static_cast<int>(tok.size()) - 1);
    }
    std::vector<float> logits(static_cast<size_t>(B) * Vp);
    auto t0 = Clock::now();
    {
      // Chunks of prefill_chunk rows; a sequence's last prompt row (rows[b])
      // gives logits row b, from whichever chunk holds it.
      const int n = static_cast<int>(tok.size());
      std::vector<int> chunk_rows;
      std::vector<float> chunk_logits;
      for (int r0 = 0; r0 < n; r0 += a.prefill_chunk) {
        const int r1 = std::min(n, r0 + a.prefill_chunk);
        chunk_rows.clear();
        std::vector<int> owners;
        for (int b = 0; b < B; b++)
          if (rows[b] >= r0 && rows[b] < r1) {
            chunk_rows.push_back(rows[b] - r0);
            owners.push_back(b);
          }
        chunk_logits.resize(chunk_rows.size() * static_cast<size_t>(Vp));
        const auto part = [&](const std::vector<int>& v) { return std::span<const int>(v).subspan(r0, r1 - r0); };
        if (Status st = model.forward_tokens(TokenBatch{part(tok), part(seq), part(pos)}, cache, chunk_rows,
                                             chunk_logits.data());
            !st.ok())
          return fail(st);
        for (size_t k = 0; k < owners.size(); k++)
          std::copy_n(chunk_logits.data() + k * Vp, Vp, logits.data() + static_cast<size_t>(owners[k]) * Vp);
      }
    }
    const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    // Decode: one token of every sequence a step; the first step is warm-up.
    tok.assign(B, 0);
    seq.assign(ids.begin(), ids.end());
    pos.assign(B, 0);
    rows.resize(B);
    for (int b = 0; b < B; b++) rows[b] = b;
    double decode_s = 0.0;
    // --paired-roof: each timed step's bytes (weights, keys and values) per
    // second over the roof read over the weights right after it (untimed),
    // so that both fall in the same second: this host's bandwidth changes
    // phase (about 30 or 50 GB/s) within seconds, and a roof measured once
    // after the whole decode can be in the other phase.
    std::vector<double> paired;
    // The keys and values of one position of every sequence, all layers.
    const double kv_row_bytes = 2.0 * kv_dtype_bytes(*kv_dtype) * a.model.layers * a.model.kv_dim() * B;
    for (int step = 0; step < a.tokens; step++) {
      for (int b = 0; b < B; b++) {
        if (Status st = cache.extend(ids[b], 1); !st.ok()) return fail(st);
        const float* row = logits.data() + static_cast<size_t>(b) * Vp;
        tok[b] = static_cast<int>(std::max_element(row, row + a.model.vocab) - row);
        pos[b] = a.prompt + step;
      }
      auto ts = Clock::now();
      if (Status st = model.forward_tokens(TokenBatch{tok, seq, pos}, cache, rows, logits.data()); !st.ok())
        return fail(st);
      if (step > 0) {
        const double dt = std::chrono::duration<double>(Clock::now() - ts).count();
        decode_s += dt;
        if (a.paired_roof && !weight_blocks.empty()) {
          const double r = perf::read_gb_per_s_over(weight_blocks, 1) * 1e9;
          if (r > 0.0 && dt > 0.0) paired.push_back((weight_bytes + kv_row_bytes * (a.prompt + step + 1)) / dt / r);
        }
      }
      if (step == 0) op_times().reset();  // the timed steps' kernels only
    }
    const int timed = std::max(1, a.tokens - 1);
    const double tps = B * timed / decode_s;
    const double weights_read = weight_blocks.empty() ? 0.0 : perf::read_gb_per_s_over(weight_blocks, 5) * 1e9;
    const double roof = weights_read > 0.0 ? weights_read : bandwidth;
    const double limit = B * roof / weight_bytes;
    // The roof with the KV cache: a step also reads the keys and values of
    // every position each sequence has (timed step s attends to prompt + s
    // + 1 of them), at the cache's element size. of_roof: the step time
    // those bytes take at the read roof over the step time measured.
    double keys = 0.0;
    for (int step = 1; step < std::max(2, a.tokens); step++) keys += a.prompt + step + 1;
    keys /= std::max(1, a.tokens - 1);
    const double kv_bytes = kv_row_bytes * keys;
    const double of_roof = (weight_bytes + kv_bytes) / roof / (decode_s / timed);
    double of_roof_paired = 0.0;  // the median step's; 0: not measured
    if (!paired.empty()) {
      std::nth_element(paired.begin(), paired.begin() + paired.size() / 2, paired.end());
      of_roof_paired = paired[paired.size() / 2];
    }
    std::printf(
        "{\"batch\": %d, \"dtype\": \"%s\", \"prompt\": %d, \"decode_tokens_per_s\": %.1f, \"step_ms\": %.2f, "
        "\"bandwidth_limit_tokens_per_s\": %.1f, \"of_limit\": %.3f, \"kv_read_mb\": %.1f, \"of_roof\": %.3f, "
        "\"of_roof_paired\": %.3f, "
        "\"prefill_tokens_per_s\": %.1f, "
        "\"weight_mb\": %.1f, \"huge_pages_mb\": %.1f, \"kv_pool_mb\": %.1f, \"scratch_mb\": %.1f, "
        "\"rss_model_mb\": %.1f, \"rss_mb\": %.1f, "
        "\"read_gb_s\": %.2f, \"weights_read_gb_s\": %.2f, \"triad_gb_s\": %.2f, \"threads\": %d, \"kv_dtype\": \"%s\", \"int8_kernel\": \"%s\"}\n",
        B, a.dtype.c_str(), a.prompt, tps, decode_s / timed * 1e3, limit, tps / limit, kv_bytes / 1e6, of_roof,
        of_roof_paired,
        B * a.prompt / prefill_s,
        weight_bytes / 1e6, huge_bytes / 1e6, cache.bytes() / 1e6, model.inference_scratch_bytes() / 1e6,
        (rss_model - rss0) / 1e6,
        rss_bytes() / 1e6, bandwidth / 1e9, weights_read / 1e9, triad / 1e9, omp_get_max_threads(), kv_dtype_name(*kv_dtype),
        a.dtype == "int8" ? cpu::int8_kernel_info().summary.c_str() : model.int4() ? cpu::q4_kernel_summary().c_str() : "");
    if (a.ops) {
      // One decode step's time by kind of op, and what each streams: the
      // matmuls read the weights (and the head), attention the keys and
      // values; untimed is the step less its kernels (the host's bookkeeping,
      // copies, the tail of the last parallel region).
      const OpTimes& t = op_times();
      auto ms = [&](OpKind k) { return t.seconds[static_cast<int>(k)] / timed * 1e3; };
      const double mm = t.seconds[static_cast<int>(OpKind::kMatmul)] / timed;
      const double att = t.seconds[static_cast<int>(OpKind::kAttention)] / timed;
      std::printf(
          "{\"batch\": %d, \"dtype\": \"%s\", \"step_ms\": %.3f, \"matmul_ms\": %.3f, \"attention_ms\": %.3f, "
          "\"norm_ms\": %.3f, \"elementwise_ms\": %.3f, \"embedding_ms\": %.3f, \"untimed_ms\": %.3f, "
          "\"matmul_gb_s\": %.2f, \"matmul_of_read_roof\": %.3f, \"attention_gb_s\": %.2f}\n",
          B, a.dtype.c_str(), decode_s / timed * 1e3, ms(OpKind::kMatmul), ms(OpKind::kAttention),
          ms(OpKind::kLayernorm), ms(OpKind::kElementwise), ms(OpKind::kEncoder),
          (decode_s - t.total()) / timed * 1e3, mm > 0 ? weight_bytes / mm / 1e9 : 0.0,
          mm > 0 ? weight_bytes / mm / roof : 0.0, att > 0 ? kv_bytes / att / 1e9 : 0.0);
    }
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace

void add_bench_decode_command(CLI::App& bench) {
  auto d = std::make_shared<DecodeArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "decode", "Decode tokens/s of the serving forward (paged KV cache) against the memory-bandwidth limit");
  cmd->add_option("--preset", d->preset, "a planner preset's shape (tinyllama-1.1b, llama3-8b, ...), random weights");
  cmd->add_option("--model", d->model_dir, "a Hugging Face folder (its weights and shape)")->check(CLI::ExistingPath);
  cmd->add_option("--kv-heads", d->kv_heads, "key/value heads (grouped-query attention)")->check(CLI::PositiveNumber);
  cmd->add_option("--mlp-hidden", d->mlp_hidden, "SwiGLU width of a Llama-family preset")->check(CLI::PositiveNumber);
  cmd->add_option("--layers", d->model.layers)->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--heads", d->model.heads)->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--dim", d->model.channels)->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--vocab", d->model.vocab)->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--context", d->model.context)->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--batch", d->batches, "sequences decoded together, one run each")
      ->check(CLI::PositiveNumber)
      ->delimiter(',');
  cmd->add_option("--prompt", d->prompt, "prompt tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--tokens", d->tokens, "tokens decoded per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--block-size", d->block_size, "KV-cache block size (positions)")->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", d->prefill_chunk,
                  "prompt rows a forward (the server's max_batch_tokens, llama.cpp's n_ubatch)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--dtype", d->dtype, "fp32, bf16, int8 (the INT8 tier: matmul weights quantized), int4 or int4k (Q4_0 or Q4_K blocks)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "int4", "int4k"}));
  add_int8_kernel_option(cmd, &d->int8_kernel);
  cmd->add_option("--kv-dtype", d->kv_dtype, "the KV cache's element type: fp32, or f16 (half the memory and reads)")
      ->check(CLI::IsMember({"fp32", "f16"}))
      ->capture_default_str();
  cmd->add_flag("--ops", d->ops,
                "time each kind of op of a decode step (a second JSON line per batch: matmul, attention, norm, "
                "elementwise and embedding ms, and the GB/s the matmuls and attention stream)");
  cmd->add_flag("--paired-roof", d->paired_roof,
                "read the weights once after every timed step (untimed) and report of_roof_paired, the median "
                "step's bytes per second over that read's: robust to a read roof that changes within seconds");
  cmd->callback([d] { exit_code() = run_decode_bench(*d); });
}

}  // namespace tessera::tools

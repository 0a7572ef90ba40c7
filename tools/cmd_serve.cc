// tessera serve: an OpenAI-compatible HTTP server over one model, or over
// the promoted version of a model in a registry (--registry; swapped while
// serving when another is promoted) (src/serve/; docs/serving.md). Binds first, so /health answers 503 while
// the model loads; SIGTERM or SIGINT drains (running requests finish, new
// ones get 503) and exits 0.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include "ckpt/checkpoint.h"
#include "data/tokenizer.h"
#include "io/file.h"
#include "kernels/cpu/int8_kernel.h"
#include "nn/gpt2_weights.h"
#include "nn/kv_cache.h"
#include "obs/process.h"
#include "serve/engine.h"
#include "serve/registry.h"
#include "serve/model_assets.h"
#include "serve/registry_catalog.h"
#include "serve/server.h"
#include "tools/commands.h"
#include "train/checkpointing.h"

namespace tessera::tools {

namespace {

struct ServeArgs {
  std::string model, registry, served_name, host = "127.0.0.1", dtype = "fp32", backend = "cpu", api_key, tokenizer, vocab_dir;
  std::string chat_template;  // --chat-template FILE
  serve::TlsOptions tls;
  serve::DoorLimits door;
  std::string int8_kernel = "auto";
  int port = 8000;
  int max_seqs = 32;
  int max_queue = 256;
  int kv_blocks = 0;
  double kv_memory_mb = 0;
  std::string kv_dtype = "fp32";
  int max_batch_tokens = 256;
  int threads = 0;
  double queue_timeout_s = 60;
  double drain_timeout_s = 30;
  size_t max_body_bytes = 1 << 20;
  bool fault_injection = false;
  bool no_prefix_cache = false;
};

// A Hugging Face folder (config.json: GPT-2, Llama, Mistral, Qwen2), a
// safetensors file (config.json beside it) or a checkpoint folder (step-N,
// or a checkpoint.dir whose latest is followed).
// use kInt8Inference quantizes the weights of a file or folder tensor by
// tensor as they are read; a checkpoint is read whole (fp32).
Result<std::unique_ptr<GPT>> load_model(const std::string& path, Backend backend, ModelUse use) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) && std::filesystem::exists(std::filesystem::path(path) / "config.json", ec))
    return load_gpt2(path, nullptr, backend, use);
  if (std::filesystem::is_directory(path, ec)) {
    ASSIGN_OR_RETURN(ckpt::Checkpoint ck, ckpt::Checkpoint::open(path));
    ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, load_whole_model(ck));
    if (backend == Backend::kCPU) return model;
    return Status::InvalidArgument("serving a checkpoint folder runs on the CPU; export it for --backend cuda");
  }
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    Status st = io::check_regular_file(path);  // names a FIFO or a device, without opening it
    if (!st.ok()) return st.With("--model");
  }
  if (!std::filesystem::is_regular_file(path, ec))
    return Status::NotFound(
        fmt::format("--model {}: no such file or folder (a GPT-2 safetensors file or a checkpoint folder)", path));
  return load_gpt2(path, nullptr, backend, use);
}

// A model ready to serve under `id`: loaded, at the precision --dtype asks,
// with its tokenizer and engine; logs its "ready" line.
Result<std::shared_ptr<serve::ServedModel>> load_served(const ServeArgs& a, Backend backend, obs::Registry& registry,
                                                        const std::string& path, const std::string& id) {
  // --dtype int8 on the CPU: the INT8 tier's model, which never holds the
  // fp32 matmul weights (issue #30 item 3); int4 / int4k: the fp32 model
  // quantized into 4-bit blocks, its fp32 matmul weights then given back.
  const serve::InferenceDtype d{backend, a.dtype, path, "serve: " + id};
  ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, load_model(path, backend, serve::inference_use(d)));
  GPT& m = *model;
  RETURN_IF_ERROR(serve::apply_inference_dtype(m, d));
  // Both ways to INT8 ran the kernel's self-check (nn/int8_check.h).
  if (m.int8()) std::fprintf(stderr, "serve: %s: int8 matmul %s\n", id.c_str(), cpu::int8_kernel_info().summary.c_str());
  // The INT8 forward reads none of the fp32 matmul weights: their memory
  // goes back to the system.
  if (m.int8()) RETURN_IF_ERROR(m.release_fp32_matmul_weights().status());
  // What loading cost (issue #30 item 3): the resident set now, and its peak.
  if (Result<obs::ProcessStats> ps = obs::read_process_stats(); ps.ok())
    std::fprintf(stderr, "serve: %s: weights loaded; resident %.0f MB, peak %.0f MB while loading\n", id.c_str(),
                 ps->resident_bytes / 1e6, ps->peak_resident_bytes / 1e6);
  const GPTConfig cfg = m.config();
  const int block_size = serve::EngineOptions{}.block_size;
  ASSIGN_OR_RETURN(const KvDtype kv_dtype, parse_kv_dtype(a.kv_dtype));  // run_serve checked the pairing
  const int64_t block_bytes = PagedKVCache::bytes_per_block(m, block_size, kv_dtype);
  // The KV cache the engine would allocate, with what stays resident of the
  // weights (the fp32 tensors, their released pages aside, and the INT8 and
  // 4-bit matrices), against the host's memory, before the cache is
  // allocated (issue #18 item 1).
  const double kv_blocks =
      serve::kv_cache_blocks({a.kv_memory_mb, a.kv_blocks, a.max_seqs}, cfg.context, block_size, block_bytes);
  const double weights = static_cast<double>(m.params().bytes() - m.released_bytes() + m.int8_bytes() + m.q4_bytes());
  RETURN_IF_ERROR(serve::check_serving_memory(id, weights, kv_blocks, block_bytes, block_size, obs::host_memory_limit()));

  auto served = std::make_shared<serve::ServedModel>();
  served->id = id;
  // The tokenizer, chat template and end ids: the folder's (tokenizer.json,
  // tokenizer_config.json, generation_config.json) unless the flags say.
  ASSIGN_OR_RETURN(serve::ModelAssets assets,
                   serve::load_model_assets(path, a.tokenizer, a.vocab_dir, a.chat_template, cfg.vocab));
  served->owned_tokenizer = std::move(assets.tokenizer);
  served->tokenizer = served->owned_tokenizer.get();
  served->chat_template = assets.chat_template;
  served->sampling_defaults = assets.sampling;
  const data::Tokenizer& tok = *served->tokenizer;
  std::fprintf(stderr, "serve: %s: %s%s\n", id.c_str(), assets.source.c_str(),
               assets.stop_tokens.empty() ? "" : fmt::format(", end ids {}", fmt::join(assets.stop_tokens, " ")).c_str());

  serve::EngineOptions eo;
  eo.max_seqs = a.max_seqs;
  eo.max_queue = a.max_queue;
  eo.max_batch_tokens = std::max(a.max_batch_tokens, a.max_seqs);
  eo.queue_timeout_s = a.queue_timeout_s;
  eo.eot_token = static_cast<int>(tok.eot());
  eo.stop_tokens = assets.stop_tokens;
  eo.prefix_cache = !a.no_prefix_cache;
  eo.kv_blocks = a.kv_blocks;
  eo.block_size = block_size;
  eo.kv_dtype = kv_dtype;
  if (a.kv_memory_mb > 0) eo.kv_blocks = static_cast<int>(kv_blocks);
  const bool int8 = m.int8();
  ASSIGN_OR_RETURN(served->owned_engine, serve::Engine::create(std::move(model), eo, registry));
  served->engine = served->owned_engine.get();
  const serve::EngineStats st = served->engine->stats();
  std::fprintf(stderr,
               "serve: %s ready: %s, %s on %s; KV cache %d blocks of %d positions (%.1f MB, %s), up to %d "
               "sequences, %d queued\n",
               id.c_str(), cfg.str().c_str(), int8 ? "int8" : a.dtype.c_str(), a.backend.c_str(), st.kv_blocks,
               eo.block_size, static_cast<double>(st.kv_blocks) * block_bytes / (1 << 20), kv_dtype_name(kv_dtype), a.max_seqs,
               a.max_queue);
  return served;
}

int run_serve(const ServeArgs& a) {
  if (a.kv_blocks > 0 && a.kv_memory_mb > 0) return fail(Status::InvalidArgument("give --kv-blocks or --kv-memory, not both"));
  // Before any model is loaded (PagedKVCache::create refuses it too).
  if (a.kv_dtype == "f16" && a.backend == "cuda")
    return fail(Status::InvalidArgument("--kv-dtype f16 runs on the CPU (the CUDA kernels read an fp32 cache)"));
  Backend backend = Backend::kCPU;
  if (a.backend == "cuda") {
    backend = Backend::kCUDA;
    if (Status st = backend_available(backend); !st.ok()) return fail(st);
  }
  if (a.threads > 0) omp_set_num_threads(a.threads);
  if (Status st = apply_int8_kernel(a.int8_kernel); !st.ok()) return fail(st);

  // SIGTERM and SIGINT go to one waiting thread (blocked everywhere else:
  // the threads started from here inherit the mask).
  const sigset_t stop_signals = block_stop_signals();

  obs::Registry registry;
  serve::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.tls = a.tls;
  so.door = a.door;
  so.backend = a.backend;
  so.max_body_bytes = a.max_body_bytes;
  so.drain_timeout_s = a.drain_timeout_s;
  so.fault_injection = a.fault_injection;
  // $TESSERA_REGISTRY only when --model is not a file or folder itself.
  std::string registry_root = a.registry;
  std::error_code ec;
  if (registry_root.empty() && std::getenv("TESSERA_REGISTRY") && !std::filesystem::exists(a.model, ec))
    registry_root = std::getenv("TESSERA_REGISTRY");
  if (!registry_root.empty() && !a.served_name.empty())
    return fail(Status::InvalidArgument("--served-model-name does not go with --registry (the id is the model's name)"));
  so.model_name = !registry_root.empty()          ? a.model
                  : !a.served_name.empty()        ? a.served_name
                  : std::filesystem::is_directory(a.model) ? std::filesystem::path(a.model).filename().string()
                                                          : std::filesystem::path(a.model).stem().string();
  if (so.model_name.empty()) so.model_name = "model";
  serve::Server server(so, registry);
  if (Status st = server.start(a.max_seqs + a.max_queue); !st.ok()) return fail(st);
  std::fprintf(stderr, "serve: listening on %s://%s:%d (loading %s)\n", a.tls.scheme(), a.host.c_str(), server.port(),
               a.model.c_str());

  // Signals during loading end the process at once; later ones drain.
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::atomic<bool> exiting{false};  // the main thread is done: the signal thread just ends
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (exiting) return;
    stopping = true;
    if (!ready) {
      std::fprintf(stderr, "serve: signal %d while loading; exiting\n", sig);
      std::fflush(stderr);
      std::_Exit(kExitError);
    }
    std::fprintf(stderr, "serve: signal %d: draining (up to %.0f s)\n", sig, a.drain_timeout_s);
    const bool drained = server.shutdown();
    std::fprintf(stderr, "serve: %s\n", drained ? "drained; exiting" : "drain timed out; cancelled the rest");
  });
  // Ends the signal thread when the server stops for any other reason.
  auto join_signals = [&] {
    exiting = true;
    if (!stopping) pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
  };

  auto fail_loading = [&](const Status& st) {
    ready = true;  // the signal thread may now stop the server instead of exiting
    server.shutdown();
    join_signals();
    return fail(st);
  };
  if (!registry_root.empty()) {
    auto reg = serve::ModelRegistry::open(registry_root);
    if (!reg.ok()) return fail_loading(reg.status());
    serve::RegistryCatalog::Options ro;
    ro.name = a.model;
    ro.prefer = a.dtype == "int4k" ? "int4" : a.dtype;
    auto catalog = serve::RegistryCatalog::open(
        std::move(*reg), ro,
        [&a, backend, &registry](const std::string& path, const std::string& id) {
          return load_served(a, backend, registry, path, id);
        },
        [](const std::string& line) {
          std::fprintf(stderr, "serve: %s\n", line.c_str());
          std::fflush(stderr);
        });
    if (!catalog.ok()) return fail_loading(catalog.status());
    server.set_models(std::move(*catalog));
  } else {
    auto served = load_served(a, backend, registry, a.model, so.model_name);
    if (!served.ok()) return fail_loading(served.status());
    server.set_models(serve::single_model_catalog(std::move(*served)));
  }
  ready = true;
  server.wait();
  join_signals();
  return kExitOk;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", a->model,
                  "GPT-2 safetensors file (config.json beside it) or a checkpoint folder; with --registry, the "
                  "model's name")
      ->required();
  cmd->add_option("--registry", a->registry,
                  "serve the promoted version of --model from this model registry (default: $TESSERA_REGISTRY); "
                  "a newly promoted version is swapped in while serving");
  cmd->add_option("--served-model-name", a->served_name, "the model id clients send (default: the file's stem)");
  cmd->add_option("--host", a->host, "address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", a->port, "TCP port; 0 picks a free one (printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--dtype", a->dtype,
                  "matmul precision; int8 quantizes the matmul weights at load (CPU), int4 and int4k into 4-bit "
                  "blocks (Q4_0, Q4_K; CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "int4", "int4k"}));
  cmd->add_option("--backend", a->backend, "cpu, or cuda where built and a GPU is present")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--max-seqs", a->max_seqs, "sequences decoded together at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-queue", a->max_queue, "requests waiting at most; more get 429")
      ->capture_default_str()
      ->check(CLI::Range(0, 65536));
  cmd->add_option("--kv-blocks", a->kv_blocks, "KV-cache blocks of 16 positions (default: max-seqs full contexts)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--kv-memory", a->kv_memory_mb, "KV-cache size in MiB, instead of --kv-blocks")
      ->check(CLI::Range(0.001, 1e7));
  cmd->add_option("--kv-dtype", a->kv_dtype,
                  "the KV cache's element type: fp32, or f16 (IEEE half, as llama.cpp's cache: half the memory, "
                  "twice the blocks in --kv-memory; CPU only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "f16"}));
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "tokens per step (decodes plus prefill chunks)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-body", a->max_body_bytes, "largest request body in bytes")
      ->capture_default_str()
      ->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--queue-timeout", a->queue_timeout_s, "seconds a request may wait for admission before a 503")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  cmd->add_option("--drain-timeout", a->drain_timeout_s, "seconds SIGTERM waits for running requests")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_flag("--fault-injection", a->fault_injection,
               "enable POST /admin/fault from loopback: hang, error, device_error, none (failover drills)");
  cmd->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--tls-cert", a->tls.cert, "serve HTTPS: the server's certificate chain (PEM)");
  cmd->add_option("--tls-key", a->tls.key, "HTTPS: the certificate's private key (PEM)");
  cmd->add_option("--tls-client-ca", a->tls.client_ca,
                  "HTTPS: accept only clients with a certificate signed by these CAs (PEM)");
  add_http_limit_options(cmd, &a->door);
  cmd->add_option("--threads", a->threads, "OpenMP threads for the model (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--tokenizer", a->tokenizer,
                  "byte, gpt2, or a Hugging Face tokenizer.json or its folder (default: the model folder's "
                  "tokenizer.json, else gpt2 for a vocabulary >= 50257, else byte)");
  cmd->add_flag("--no-prefix-cache", a->no_prefix_cache,
                "turn automatic prefix caching off (on by default: a prompt reuses the KV blocks of its longest "
                "cached prefix)");
  cmd->add_option("--chat-template", a->chat_template,
                  "a Jinja chat template file for /v1/chat/completions (default: the model folder's "
                  "tokenizer_config.json chat_template, else the plain-text format)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--vocab", a->vocab_dir, "folder with encoder.json and vocab.bpe (default: data/raw/gpt2)");
  add_int8_kernel_option(cmd, &a->int8_kernel);
  cmd->callback([a] { exit_code() = run_serve(*a); });
}

}  // namespace tessera::tools

// tessera sample: generate text from safetensors weights, streaming each
// token to stdout as it is drawn; a last line on stderr gives tokens/s.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "nn/gpt2_weights.h"
#include "nn/sampler.h"
#include "serve/model_assets.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {
struct SampleArgs {
  std::string weights, prompt, tokenizer, vocab_dir, backend = "cpu", int8_kernel = "auto", dtype = "fp32";
  int tokens = 64;
  float temperature = 1.0f;
  int top_k = 40;
  uint64_t seed = 1337;
  bool no_cache = false;
};

// The text of one generated id. End-of-text shows as GPT-2's marker (the
// byte tokenizer's would be a NUL byte); ids the model has but the tokenizer
// lacks (a model vocabulary larger than the tokenizer's) as <|id|>.
std::string token_text(const data::Tokenizer& tok, int id) {
  if (id == static_cast<int>(tok.eot())) return "<|endoftext|>";
  if (id >= tok.vocab_size()) return "<|" + std::to_string(id) + "|>";
  return tok.decode_token(static_cast<uint32_t>(id));
}

int run_sample(const SampleArgs& a) {
  const Backend backend = a.backend == "cuda" ? Backend::kCUDA : Backend::kCPU;
  // Before the weights are read: a build or machine without CUDA is one line.
  if (Status st = backend_available(backend); !st.ok()) return fail(st.With("--backend cuda"));
  if (Status st = apply_int8_kernel(a.int8_kernel); !st.ok()) return fail(st);
  // The full-recompute baseline reads logits() for the whole sequence, which
  // the chunked CUDA output layer does not keep.
  if (a.no_cache && backend != Backend::kCPU)
    return fail(Status::InvalidArgument("--no-cache runs on the CPU only (--backend cpu)"));
  if ((a.dtype == "int8" || a.dtype == "int4" || a.dtype == "int4k") && backend != Backend::kCPU)
    return fail(Status::InvalidArgument(fmt::format("--dtype {} is a CPU tier (--backend cpu)", a.dtype)));
  // int8: quantized tensor by tensor as the weights are read (an INT8 file
  // loads as one whatever --dtype says); int4 / int4k: 4-bit blocks.
  const serve::InferenceDtype d{backend, a.dtype, a.weights, "sample"};
  auto model = load_gpt2(a.weights, nullptr, backend, serve::inference_use(d));
  if (!model.ok()) return fail(model.status());
  GPT& m = *model.value();
  if (Status st = serve::apply_inference_dtype(m, d); !st.ok()) return fail(st);
  const GPTConfig& cfg = m.config();

  // The model folder's tokenizer.json, else GPT-2 BPE for a GPT-2-sized
  // vocabulary, else bytes (as tessera serve).
  auto assets = serve::load_model_assets(a.weights, a.tokenizer, a.vocab_dir, "", cfg.vocab);
  if (!assets.ok()) return fail(assets.status().With(a.weights));
  const data::Tokenizer& tok = *assets->tokenizer;

  std::vector<int> prompt;
  // A Hugging Face tokenizer adds what transformers adds (Llama's BOS).
  const auto* hf = dynamic_cast<const data::HfTokenizer*>(&tok);
  for (uint32_t t : hf ? hf->encode(a.prompt, data::EncodeOptions{.add_special_tokens = true}) : tok.encode(a.prompt))
    prompt.push_back(static_cast<int>(t));
  if (prompt.empty()) prompt.push_back(static_cast<int>(tok.eot()));  // unconditional: start a new document
  if (static_cast<int>(prompt.size()) > cfg.context)
    return fail(Status::InvalidArgument(fmt::format("the prompt is {} tokens, longer than the model's context of {}",
                                                    prompt.size(), cfg.context)));

  std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
  std::fflush(stdout);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  double first_token_s = 0.0;
  auto on_token = [&](int id) {
    if (first_token_s == 0.0) first_token_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string text = token_text(tok, id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  auto out = generate(m, prompt, a.tokens, a.temperature, a.top_k, a.seed, !a.no_cache, on_token);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("\n");
  std::fflush(stdout);
  if (!out.ok()) return fail(out.status());

  const int n = static_cast<int>(out->size());
  std::string stopped;
  if (n < a.tokens)
    stopped = fmt::format("; stopped at the model's context of {} tokens", cfg.context);
  std::fprintf(stderr,
               "sample: %d tokens in %.3f s = %.2f tokens/s (prompt %zu tokens, first token after %.3f s, %s)%s\n",
               n, seconds, n / std::max(seconds, 1e-9), prompt.size(), first_token_s,
               a.no_cache ? "no cache: full recompute per token" : "KV cache", stopped.c_str());
  return kExitOk;
}
}  // namespace

void add_sample_command(CLI::App& app) {
  // CLI::NonNegativeNumber would print the largest double in its message.
  static const CLI::Validator kNonNegativeFinite(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !(x >= 0.0) || !std::isfinite(x))
          return "must be a finite number >= 0, got '" + text + "'";
        return "";
      },
      "NONNEGATIVE");
  auto a = std::make_shared<SampleArgs>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a model, streaming tokens to stdout");
  cmd->add_option("--weights", a->weights, "a Hugging Face model: its folder, or model.safetensors with config.json beside it (GPT-2, Llama, Mistral, Qwen2)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--prompt", a->prompt, "text to continue (default: empty, start from end-of-text)");
  cmd->add_option("--tokens", a->tokens, "tokens to generate (fewer if the context fills up)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", a->temperature, "softmax temperature; 0 = always the most likely token")
      ->capture_default_str()
      ->check(kNonNegativeFinite);
  cmd->add_option("--top-k", a->top_k, "sample among the K most likely tokens; 0 = all")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "random seed (same seed, same text)")->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "byte (vocab 256), gpt2 (BPE), or a Hugging Face tokenizer.json or its folder; default: gpt2 if "
                  "the model's vocabulary has >= 50257 tokens, else byte");
  cmd->add_option("--vocab", a->vocab_dir, "folder with encoder.json and vocab.bpe for gpt2 (default: data/raw/gpt2)");
  cmd->add_flag("--no-cache", a->no_cache, "recompute the whole sequence for every token (slow; the baseline)");
  cmd->add_option("--backend", a->backend, "cpu, or cuda where built and a GPU is present (device 0)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dtype", a->dtype, "matmul precision: fp32, bf16, int8 (the CPU's INT8 tier), int4 or int4k (its 4-bit tiers: Q4_0, Q4_K blocks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "int4", "int4k"}));
  add_int8_kernel_option(cmd, &a->int8_kernel);
  cmd->callback([a] { exit_code() = run_sample(*a); });
}

}  // namespace tessera::tools

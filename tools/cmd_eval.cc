// tessera eval: mean cross-entropy of safetensors weights over a token shard.
#include <cstdio>
#include <string>

#include "data/shard.h"
#include "nn/gpt2_weights.h"
#include "serve/model_assets.h"
#include "tools/commands.h"
#include "train/evaluate.h"

namespace tessera::tools {

namespace {
struct EvalArgs {
  std::string weights, tokens, dtype = "fp32";
  int batch = 4, seq = 0, max_batches = 0;
  GPTConfig shape;  // used only when no config.json sits beside the weights
};

int run_eval(const EvalArgs& a) {
  GPTConfig fallback = a.shape;
  bool have_fallback = fallback.layers > 0;
  auto model = load_gpt2(a.weights, have_fallback ? &fallback : nullptr, Backend::kCPU, ModelUse::kInference);
  if (!model.ok()) return fail(model.status());
  GPT& m = *model.value();
  m.set_precision(a.dtype == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32);
  // The CPU tiers' matmuls (quality against fp32: docs/performance.md).
  if (a.dtype == "int8") {
    if (Status st = m.quantize_int8(); !st.ok()) return fail(st);
  }
  if (Status st = serve::apply_int4_dtype(m, a.dtype, "eval", false); !st.ok()) return fail(st);
  auto tokens = data::read_shard(a.tokens);
  if (!tokens.ok()) return fail(tokens.status());
  // Every id against the vocabulary, named by its place in the file.
  auto id_bytes = data::read_shard_id_bytes(a.tokens);
  if (!id_bytes.ok()) return fail(id_bytes.status());
  if (Status st = data::check_token_ids(tokens.value(), m.config().vocab, a.tokens, *id_bytes); !st.ok())
    return fail(st);
  int seq = a.seq > 0 ? a.seq : std::min(m.config().context, 1024);
  auto r = evaluate(m, tokens.value(), a.batch, seq, a.max_batches);
  if (!r.ok()) return fail(r.status().With(a.tokens));
  std::printf("{\"loss\": %.7f, \"tokens\": %lld, \"batches\": %d}\n", r->loss, static_cast<long long>(r->tokens),
              r->batches);
  return kExitOk;
}
}  // namespace

void add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Mean cross-entropy of a model over a token file");
  cmd->add_option("--weights", a->weights, "a Hugging Face model: its folder, or model.safetensors with config.json beside it (GPT-2, Llama, Mistral, Qwen2)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--tokens", a->tokens, "token shard (llm.c format)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--batch", a->batch, "sequences per batch (B)")->check(CLI::PositiveNumber);
  cmd->add_option("--seq", a->seq, "tokens per sequence (T); default: the model's context, at most 1024")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-batches", a->max_batches, "evaluate at most this many batches (0: all)");
  cmd->add_option("--dtype", a->dtype,
                  "matmul precision: fp32, bf16, int8 (the INT8 tier), int4 (Q4_0 blocks) or int4k (Q4_K blocks)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "int4", "int4k"}));
  cmd->add_option("--layers", a->shape.layers, "model shape when there is no config.json");
  cmd->add_option("--heads", a->shape.heads, "model shape when there is no config.json");
  cmd->add_option("--dim", a->shape.channels, "model shape when there is no config.json");
  cmd->add_option("--vocab", a->shape.vocab, "model shape when there is no config.json");
  cmd->add_option("--context", a->shape.context, "model shape when there is no config.json");
  cmd->callback([a] { exit_code() = run_eval(*a); });
}

}  // namespace tessera::tools

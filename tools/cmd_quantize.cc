// tessera quantize: a Hugging Face model (GPT-2, Llama, Mistral, Qwen2) ->
// its INT8 form (docs/formats/int8.md), the weights of the CPU tier's model;
// or, with --out FILE.gguf, a GGUF file (docs/formats/gguf.md) in F32, F16,
// Q8_0, Q4_0 (int4) or Q4_K (int4k) with the model's vocabulary: the
// project's converter, so that llama.cpp and Tessera run the same weights.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/progress.h"
#include "data/gguf_vocab.h"
#include "io/file.h"
#include "nn/gguf_model.h"
#include "nn/gpt2_weights.h"
#include "obs/process.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct QuantizeArgs {
  std::string weights, out, dtype, vocab_dir = "data/raw/gpt2";
};

// The folder's tokenizer.json, else GPT-2's vocabulary files for a GPT-2
// sized vocabulary; "" for none (the file then has no vocabulary).
std::string vocab_source(const QuantizeArgs& a, const GPT& m) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::is_directory(a.weights, ec) ? fs::path(a.weights) : fs::path(a.weights).parent_path();
  if (fs::exists(dir / "tokenizer.json", ec)) return dir.string();
  if (m.config().vocab == 50257 && fs::exists(fs::path(a.vocab_dir) / "encoder.json", ec)) return a.vocab_dir;
  return "";
}

int run_quantize_gguf(const QuantizeArgs& a) {
  auto weights = parse_gguf_weights(a.dtype.empty() ? "q4_0" : a.dtype);
  if (!weights.ok()) return fail(weights.status().With("--dtype"));
  ProgressBar bar(ProgressBar::tty(stderr), 2, "steps");
  bar.update(0, "reading " + a.weights);
  auto model = load_gpt2(a.weights, nullptr, Backend::kCPU, ModelUse::kInference);
  if (!model.ok()) return bar.interrupt(), fail(model.status());
  const GPT& m = *model.value();
  const std::string vocab = vocab_source(a, m);
  bar.update(1, "writing " + a.out);
  Status st = save_gguf(m, a.out, *weights, [&](io::GgufWriter& w) -> Status {
    if (vocab.empty()) return Status::OK();
    return data::write_gguf_vocab(vocab, w);
  });
  if (!st.ok()) return bar.interrupt(), fail(st);
  bar.finish("done");
  std::error_code ec;
  std::printf("converted %s: %s -> %s (%s, %.1f MB; vocabulary: %s)\n", a.weights.c_str(), m.config().str().c_str(),
              a.out.c_str(), a.dtype.empty() ? "q4_0" : a.dtype.c_str(),
              static_cast<double>(std::filesystem::file_size(a.out, ec)) / 1e6, vocab.empty() ? "none" : vocab.c_str());
  return kExitOk;
}

int run_quantize(const QuantizeArgs& a) {
  // The output first (its folder made if missing): a path that cannot be
  // written fails before the model is read.
  if (Status st = io::check_writable_file(a.out); !st.ok()) return fail(st.With("--out"));
  if (a.out.ends_with(".gguf")) return run_quantize_gguf(a);
  if (!a.dtype.empty() && a.dtype != "int8")
    return fail(Status::InvalidArgument(fmt::format(
        "--dtype {}: a safetensors --out holds INT8; give --out FILE.gguf for f32, f16, q8_0, int4 or int4k", a.dtype)));
  ProgressBar bar(ProgressBar::tty(stderr), 3, "steps");
  bar.update(0, "reading and quantizing " + a.weights);
  // Tensor by tensor as they are read: the fp32 matmul weights never exist
  // all at once (issue #30 item 3).
  auto model = load_gpt2(a.weights, nullptr, Backend::kCPU, ModelUse::kInt8Inference);
  if (!model.ok()) return bar.interrupt(), fail(model.status());
  GPT& m = *model.value();
  bar.update(2, "writing " + a.out);
  if (Status st = save_int8(m, a.out); !st.ok()) return bar.interrupt(), fail(st);
  bar.finish("done");
  const Result<obs::ProcessStats> ps = obs::read_process_stats();
  std::printf("quantized %s: %s; %.1f MB of int8 matmul weights and scales -> %s (+ config.json); peak resident "
              "%.0f MB\n",
              a.weights.c_str(), m.config().str().c_str(), m.int8_bytes() / 1e6, a.out.c_str(),
              ps.ok() ? ps->peak_resident_bytes / 1e6 : 0.0);
  return kExitOk;
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write a model's INT8 form (the CPU tier's weights), or a GGUF file");
  cmd->add_option("--weights", a->weights, "a Hugging Face model: its folder, or model.safetensors with config.json beside it (GPT-2, Llama, Mistral, Qwen2)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--out", a->out,
                  "the INT8 safetensors file to write (config.json beside it), or FILE.gguf: a GGUF file")
      ->required();
  cmd->add_option("--dtype", a->dtype,
                  "int8 (safetensors --out), or for a .gguf --out: f32, f16, q8_0, int4 (Q4_0, the default) or int4k "
                  "(Q4_K)")
      ->check(CLI::IsMember({"int8", "f32", "f16", "q8_0", "int4", "int4k", "q4_0", "q4_k"}));
  cmd->add_option("--vocab", a->vocab_dir,
                  "GPT-2's vocabulary folder (encoder.json, vocab.bpe) for a GGUF file of a GPT-2 model without "
                  "tokenizer.json")
      ->capture_default_str();
  cmd->callback([a] { exit_code() = run_quantize(*a); });
}

}  // namespace tessera::tools

// tessera quantize: a Hugging Face model (GPT-2, Llama, Mistral, Qwen2) ->
// its INT8 form (docs/formats/int8.md), the weights of the CPU tier's model.
#include <cstdio>
#include <memory>
#include <string>

#include "core/progress.h"
#include "io/file.h"
#include "nn/gpt2_weights.h"
#include "obs/process.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct QuantizeArgs {
  std::string weights, out;
};

int run_quantize(const QuantizeArgs& a) {
  // The output first (its folder made if missing): a path that cannot be
  // written fails before the model is read.
  if (Status st = io::check_writable_file(a.out); !st.ok()) return fail(st.With("--out"));
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
  CLI::App* cmd = app.add_subcommand("quantize", "Write a model's INT8 form (the CPU tier's weights)");
  cmd->add_option("--weights", a->weights, "a Hugging Face model: its folder, or model.safetensors with config.json beside it (GPT-2, Llama, Mistral, Qwen2)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--out", a->out, "the INT8 safetensors file to write (config.json beside it)")->required();
  cmd->callback([a] { exit_code() = run_quantize(*a); });
}

}  // namespace tessera::tools

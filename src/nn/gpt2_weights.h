// Weights interchange with the Hugging Face GPT-2 layout (GPT2LMHeadModel
// tensor names, Conv1D weights stored [in, out]) in safetensors, with the
// hyper-parameters in a config.json beside the weights.
// See docs/formats/safetensors.md for the name mapping.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"
#include "nn/gpt.h"

namespace tessera {

// n_layer, n_head, n_embd, n_positions, vocab_size from a config.json.
Result<GPTConfig> read_hf_config(const std::string& path);
Status write_hf_config(const GPTConfig& c, const std::string& path);
// The config.json that belongs to a weights file: same folder.
std::string hf_config_path(const std::string& weights_path);

// Checks f's tensors against c without allocating: the layer count (from
// the names, first), then every name, shape and dtype load_hf_weights reads
// (the INT8 layout when f's metadata says so); an error names the first
// mismatch in one line.
Status check_hf_tensors(const GPTConfig& c, const io::SafetensorsFile& f);

// Copies the tensors of f into model's parameters. Accepts names with or
// without the "transformer." prefix; ignores attention-mask buffers
// (attn.bias, attn.masked_bias) and lm_head.weight (tied to wte). A missing
// or unexpected tensor, or a shape that does not match model.config(), is an
// error naming the tensor. Works for a model on any device.
Status load_hf_weights(GPT& model, const io::SafetensorsFile& f);

// Opens path, takes the config from config.json beside it (or *fallback when
// there is none), checks the tensors against it (check_hf_tensors), and only
// then builds the model and loads the weights.
Result<std::unique_ptr<GPT>> load_gpt2(const std::string& path, const GPTConfig* fallback,
                                       Backend backend = Backend::kCPU, ModelUse use = ModelUse::kTraining);

// An arena laid out like model's parameters (the parameters themselves, the
// gradients, an optimizer moment) as HF-named, HF-shaped fp32 tensors, on
// the host whatever device a is on. A device arena is read through a host
// copy: memory the host cannot give or a failed copy is the error.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
Result<std::vector<HfTensor>> to_hf_tensors(const GPT& model, const Arena& a);

// Writes the parameters as HF-layout safetensors at path and config.json
// beside it (both atomically).
Status save_hf(const GPT& model, const std::string& path);
// An INT8 model (GPT::quantize_int8) as docs/formats/int8.md describes: the
// HF layout with every matmul weight NAME replaced by NAME_int8 (I8, (OC, C))
// and NAME_scale (F32, (OC)), plus lm_head.weight_int8/_scale for the tied
// output layer, and the metadata tessera_quantization; config.json beside
// it. load_hf_weights (and load_gpt2) read such a file into an INT8 model.
Status save_int8(const GPT& model, const std::string& path);

}  // namespace tessera

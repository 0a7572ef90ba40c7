// Hugging Face model folders of the Llama family in and out: config.json
// whose architectures is LlamaForCausalLM, MistralForCausalLM or
// Qwen2ForCausalLM, weights in one model.safetensors or in shards listed by
// model.safetensors.index.json, tensors in F32, BF16 or F16 (converted to
// fp32 at load). docs/formats/hf-models.md maps the names. GPT-2 folders
// (GPT2LMHeadModel) go through nn/gpt2_weights.h; load_gpt2 sends every
// other architecture here, so model.init_from, eval, sample, serve and
// export take either.
//
// Refused in one line naming the key or tensor (never a silently different
// model): an unknown architecture; hidden_act other than silu; rope_scaling
// other than linear or llama3; attention_bias without mlp_bias (Tessera's
// biases come as qkv, or qkv + output + MLP); quantized weights; a missing,
// unexpected or misshapen tensor. A sliding window (Mistral, Qwen2 with
// use_sliding_window) shorter than max_position_embeddings caps the model's
// context at the window, where full causal attention is the same thing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"

namespace tessera {

// The folder's config.json and weights files, resolved from a folder, a
// model.safetensors path or a model.safetensors.index.json path.
struct HfFolder {
  std::string dir;
  std::string config;              // dir/config.json
  std::vector<std::string> files;  // the weights, one or the index's shards
  std::string architecture;        // config.json's architectures[0] ("" for none)
};
// NotFound/InvalidArgument naming what is missing. A GPT-2 folder resolves
// too (architecture "GPT2LMHeadModel").
Result<HfFolder> resolve_hf_folder(const std::string& path);
// Whether path is (or sits in) a folder whose config.json names one of the
// Llama family's architectures (a cheap check: config.json only).
bool is_hf_decoder(const std::string& path);

// Any supported config.json (GPT-2's or the Llama family's) as a
// DecoderConfig, by its architectures (the planner's --hf-config).
Result<DecoderConfig> read_hf_model_config(const std::string& config_path);
// config.json of a Llama-family model as a DecoderConfig.
Result<DecoderConfig> read_hf_decoder_config(const std::string& config_path);
Status write_hf_decoder_config(const DecoderConfig& c, const std::string& path);

// Checks every tensor's name and shape against the config, then builds the
// model and loads the weights, one tensor at a time from the mapped files
// (converted to fp32 as each is read). ModelUse::kInt8Inference quantizes
// each matmul tensor as it is read, so no fp32 copy of the matmul weights
// is made; an INT8 file (save_hf_decoder_int8) always loads that way.
Result<std::unique_ptr<GPT>> load_hf_decoder(const std::string& path, Backend backend = Backend::kCPU,
                                             ModelUse use = ModelUse::kTraining);

// The parameters as HF-named, HF-shaped fp32 tensors (queries back in
// Hugging Face's head order), from an arena laid out like model's params.
Result<std::vector<HfTensor>> hf_decoder_tensors(const GPT& model, const Arena& a);

struct HfSaveOptions {
  io::StDType dtype = io::StDType::kF32;  // kF32 or kBF16 (round to nearest even)
  int64_t max_shard_bytes = int64_t{5} << 30;  // past it: model-0000k-of-0000n.safetensors + index
};
// Writes config.json and the weights into the folder of weights_path (named
// weights_path when one file holds them; otherwise HF's shard names and
// model.safetensors.index.json beside it). Whole models.
// Each tensor is converted as the writer reaches it: the host memory this
// needs beyond the model is one tensor.
Status save_hf_decoder(const GPT& model, const std::string& weights_path, const HfSaveOptions& o = {});
// An INT8 model (quantized or read from an INT8 file) in the INT8 form of
// docs/formats/int8.md: the HF layout with every matmul weight NAME (q_proj,
// k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) replaced by
// NAME_int8 (I8, HF's shape) and NAME_scale (F32, one per row), the output
// layer as lm_head.weight_int8 (Vp, C) and _scale (Vp) whether tied or not,
// the rest F32; metadata tessera_quantization; config.json beside it. One
// file. load_hf_decoder reads it into an INT8 model.
Status save_hf_decoder_int8(const GPT& model, const std::string& weights_path);
// A random-weight folder of config c (norm weights 1, biases 0, matrices
// uniform with standard deviation 0.02, deterministic for a seed), written
// tensor by tensor without building the model: an 8B-shaped folder needs
// one tensor of memory (tessera synth model; the loading benchmarks).
Status save_random_hf_decoder(const DecoderConfig& c, const std::string& weights_path, const HfSaveOptions& o,
                              uint64_t seed);

}  // namespace tessera

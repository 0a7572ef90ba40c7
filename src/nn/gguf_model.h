// GGUF model files (llama.cpp's format, docs/formats/gguf.md) in and out,
// for the `gpt2` and `llama` architectures: the models users already have
// for llama.cpp, and the project's own converter (tessera quantize --out
// FILE.gguf), so both engines run the same weights.
//
// Reading (load_gguf): the shape from the architecture's metadata keys, the
// tensors by llama.cpp's names (token_embd, blk.N.attn_q, ...; the map is in
// docs/inference.md, "GGUF models"), each checked against that shape before anything is
// allocated. Tensor types F32, F16, BF16, Q8_0, Q4_0 and Q4_K; any other is
// refused in one line naming the tensor and the type, as is an architecture
// other than gpt2 and llama, and a llama file with rotary scaling other
// than none or linear. When every matmul weight is Q4_0 or Q4_K the model
// is the int4 tier (GPT::load_q4): the blocks are used as they are in the
// file, never dequantized, so the matmuls are llama.cpp's own Q4 x Q8 dot
// products (kernels/q4.h). Otherwise every tensor is converted to fp32
// (Q4 and Q8_0 blocks dequantized exactly) and the model is an fp32 one,
// which --dtype int8 / int4 can then quantize. The file is mapped and read
// one tensor at a time: loading needs the model plus one fp32 tensor.
//
// llama.cpp stores a llama model's query and key rows permuted for its
// rotary kernel (convert_hf_to_gguf.py's permute: within each head, row
// 2i + h is Hugging Face's row h*hs/2 + i); the reader undoes it and the
// writer applies it. Tessera's own query head order (model/decoder.h) is
// applied on top; a Q4_K attention projection of a grouped-query model,
// whose columns cannot be moved in 256-wide blocks, keeps the file's column
// order and gathers its input instead (GPT::Q4Matrix::in_perm).
//
// Writing (save_gguf): version 3, every matmul weight in the requested type
// (a matrix whose width does not fit a Q4_K block falls back to Q4_0 as
// llama.cpp does); norms, biases, learned positions and the embeddings in
// F32, except the embeddings of a tied Llama, which llama.cpp also reads as
// the output layer; the tokenizer's metadata when one is given
// (data/gguf_vocab.h writes it).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "io/gguf.h"
#include "nn/gpt.h"

namespace tessera {

// The tensor types save_gguf writes: "f32", "f16", "q8_0", "q4_0", "q4_k".
enum class GgufWeights { kF32, kF16, kQ8_0, kQ4_0, kQ4_K };
// From those names; InvalidArgument naming the name otherwise.
Result<GgufWeights> parse_gguf_weights(const std::string& name);

// True when the file at path starts with GGUF's magic (a cheap check).
bool is_gguf(const std::string& path);

// The model's shape from an open GGUF file's metadata and tensors.
Result<DecoderConfig> read_gguf_config(const io::GgufFile& f);

// Loads a GGUF model (see above). use: kTraining or kInference for an fp32
// model; a file whose matmuls are all 4-bit loads as the int4 tier
// (refused for kTraining).
Result<std::unique_ptr<GPT>> load_gguf(const std::string& path, Backend backend = Backend::kCPU,
                                       ModelUse use = ModelUse::kInference);

// Writes model as a GGUF file at path, every tensor converted (or
// quantized) from the fp32 weights as the writer reaches it. metadata,
// when given, adds keys (the tokenizer's) before the file is written. A
// model whose fp32 matmul weights are gone (an INT8 or int4 model loaded
// for inference) is refused: write from the fp32 model. Atomic (written
// beside, then renamed).
Status save_gguf(const GPT& model, const std::string& path, GgufWeights weights,
                 const std::function<Status(io::GgufWriter&)>& metadata = {});

}  // namespace tessera

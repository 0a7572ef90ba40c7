// What `tessera serve` and `tessera sample` share to run a model (llama.cpp's
// common/): the precision a loaded model runs at (--dtype: quantization at
// load, the 4-bit tiers), the KV cache the server sizes and its check
// against the host's memory, and what a model needs besides its weights: the
// tokenizer, the chat template and the ids that end a generation, from a
// Hugging Face model folder (tokenizer.json, tokenizer_config.json,
// generation_config.json) or from the flags for a bare weights file
// (docs/serving.md, "Hugging Face folders"). Loading the weights stays with
// the commands: a checkpoint folder needs `ckpt`, which this layer may not
// use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "nn/gpt.h"
#include "obs/process.h"
#include "serve/engine.h"

namespace tessera::serve {

struct ModelAssets {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::shared_ptr<const data::ChatTemplate> chat_template;  // null: the plain-text chat format
  std::vector<int> stop_tokens;  // generation_config.json's eos_token_id(s), else tokenizer_config's eos_token
  SamplingDefaults sampling;     // generation_config.json's temperature, top_p, top_k (OpenAI's ranges)
  std::string source;            // where they came from, for the ready line
};

// model_path: the --model given (a folder, or a weights file whose folder
// may hold the files above; a GGUF file with a vocabulary brings its own
// tokenizer, tokenizer.chat_template and bos/eos/eot ids, data/gguf_vocab.h). tokenizer: --tokenizer ("" = the folder's
// tokenizer.json, else "gpt2" for a vocabulary of 50257 and more, else
// "byte"). chat_template: --chat-template FILE ("" = the folder's
// tokenizer_config.json, if it has one). vocab: the model's, which the
// tokenizer must fit. Errors name the file and the key.
Result<ModelAssets> load_model_assets(const std::string& model_path, const std::string& tokenizer,
                                      const std::string& vocab_dir, const std::string& chat_template, int vocab);

// --backend and --dtype of a model run for inference.
struct InferenceDtype {
  Backend backend = Backend::kCPU;
  std::string dtype = "fp32";  // fp32, bf16, int8, int4 (Q4_0 blocks) or int4k (Q4_K)
  std::string source;          // the weights' path, for errors
  std::string who;             // the log lines' prefix: "sample", "serve: ID"
};

// How to load the weights for `d`: int8 on the CPU is ModelUse::kInt8Inference
// (quantized tensor by tensor as they are read, never holding the fp32
// matmul weights); everything else kInference.
ModelUse inference_use(const InferenceDtype& d);

// Brings a model loaded with inference_use(d) to d.dtype: bf16 matmuls for
// bf16; an fp32 model quantized to INT8 for int8 (an INT8 file is INT8
// whatever --dtype says); 4-bit blocks for int4/int4k, the fp32 matmul
// weights then given back (a 4-bit file is int4 whatever --dtype says), with
// a line on stderr ("WHO: int4 q4_0: 25 matrices, 70.2 MB; kernels ...").
// InvalidArgument for int4/int4k off the CPU ("--dtype int4 is a CPU tier
// (--backend cpu)") and for int8 on a 4-bit file, naming d.source.
Status apply_inference_dtype(GPT& model, const InferenceDtype& d);

// The weights a decode step streams (GPT::stored_weights(): the INT8 or
// 4-bit matrices, else the fp32 arena; host models only) moved to 2 MiB
// pages (core/huge_pages.h; TESSERA_HUGE_PAGES=0 leaves them in 4 KiB
// ones), with a line on stderr ("WHO: weights in 2 MiB pages: 576.7 of
// 581.9 MB in 0.13 s"). Cold products 2-19% faster on Zen 4 (BM_MatmulDecodeHuge,
// docs/performance.md). apply_inference_dtype ends with it. Returns the
// bytes moved.
int64_t weights_to_huge_pages(const GPT& model, const std::string& who);

// The 4-bit tiers alone (int4, int4k; nothing for any other dtype), as
// apply_inference_dtype runs them; `release` gives the fp32 matmul weights
// back.
Status apply_int4_dtype(GPT& model, const std::string& dtype, const std::string& who, bool release);

// The KV cache the server allocates, in blocks of `block_size` positions of
// `block_bytes` each: --kv-memory MiB (rounded down, at least one block),
// else --kv-blocks, else max_seqs full contexts. A double: the flags can ask
// for more than an int holds, which check_serving_memory refuses.
struct KvCacheRequest {
  double kv_memory_mb = 0;  // 0: not given
  int kv_blocks = 0;        // 0: not given
  int max_seqs = 1;
};
double kv_cache_blocks(const KvCacheRequest& r, int context, int block_size, int64_t block_bytes);

// The weights (`weights_bytes`) and the KV cache (`kv_blocks` x
// `block_bytes`) against the host's memory (`limit`; 0 bytes: unknown, not
// checked), before the cache is allocated: InvalidArgument naming `id`, what
// it needs and what the host has, or a cache of more than INT32_MAX blocks.
Status check_serving_memory(const std::string& id, double weights_bytes, double kv_blocks, int64_t block_bytes,
                            int block_size, const obs::MemoryLimit& limit);

}  // namespace tessera::serve

// What a served model needs besides its weights: the tokenizer, the chat
// template and the ids that end a generation, from a Hugging Face model
// folder (tokenizer.json, tokenizer_config.json, generation_config.json) or
// from the flags for a bare weights file (docs/serving.md, "Hugging Face
// folders").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
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

}  // namespace tessera::serve

// Text -> token shards (llm.c format). Each input file is one document;
// documents are separated by the tokenizer's end-of-text token. The last
// val_fraction of documents (at least one when there are two or more) go to
// the validation shard.
//
// Tokenizers: "byte" (vocab 256; bytes are tokens, end-of-text is byte 0,
// which text files do not contain). GPT-2 BPE arrives with the corpus work.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or folders (recursively, sorted)
  std::string tokenizer = "byte";
  std::string out_dir;
  double val_fraction = 0.1;
};

struct PrepareSummary {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0;
  std::vector<std::string> shards;
};

Result<PrepareSummary> prepare_shards(const PrepareOptions& o);

}  // namespace tessera::data

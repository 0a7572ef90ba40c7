// Text -> token shards (llm.c format, docs/formats/token-shard.md): 16-bit
// ids (version 1) when the tokenizer's vocabulary fits, else 32-bit (version 2).
//
// Each input file is one document (for --format brown, each corpus file).
// Every document is preceded by the tokenizer's end-of-text token, as GPT-2's
// training data is. Documents are tokenised in parallel on all cores; the
// output is the same whatever the thread count. Every k-th document (k =
// round(1 / val_fraction)) goes to validation, so both splits sample every
// part of the corpus. Shards hold at most shard_tokens tokens and are named
// train_NNNNNN.bin and val_NNNNNN.bin.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or folders (recursively, sorted)
  std::string tokenizer = "gpt2";   // "gpt2", "byte", or a tokenizer.json (or its folder)
  std::string vocab_dir = "data/raw/gpt2";
  std::string format = "text";      // "text" or "brown"
  std::string out_dir;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  std::FILE* progress = nullptr;    // progress bar goes here (nullptr: none)
};

struct PrepareSummary {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0;
  double seconds = 0.0;
  int id_bits = 16;  // 16: version-1 shards; 32: version 2 (a vocabulary past 65,536)
  std::vector<std::string> shards;
};

Result<PrepareSummary> prepare_shards(const PrepareOptions& o);

// The Brown corpus's tagged text ("The/at Fulton/np-tl ...", sentences one
// per line, paragraphs separated by blank lines) as plain text: tags dropped,
// `` and '' turned into double quotes, no space before closing punctuation.
std::string brown_to_text(std::string_view tagged);

}  // namespace tessera::data

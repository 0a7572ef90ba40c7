// A GGUF file's vocabulary (its tokenizer.ggml.* keys, docs/formats/gguf.md)
// in and out, through the tokenizer interface.
//
// Reading: tokenizer.ggml.model "gpt2" (byte-level BPE: the tokens, the
// merges, the token types, bos/eos and add_bos_token) with the
// pre-tokenizer tokenizer.ggml.pre names (default / gpt-2: GPT-2's pattern;
// llama-bpe: Llama 3's; qwen2: Qwen2's, with its NFC) becomes the
// tokenizer.json that Hugging Face would hold, run by HfTokenizer, so a
// GGUF model encodes exactly as the folder it came from. Control tokens
// (type 3) are special added tokens, user-defined ones (type 4) ordinary
// added tokens. "llama" (SentencePiece: tokens, scores, types) becomes the
// byte-fallback BPE that transformers' LlamaConverter makes of it (merges
// from the scores). Another tokenizer model ("bert", ...) or pre-tokenizer
// is refused in one line naming it.
//
// Writing: the vocabulary of a GPT-2 vocabulary folder (encoder.json and
// vocab.bpe) or of a byte-level BPE tokenizer.json (with the
// tokenizer_config.json beside it for add_bos_token), as llama.cpp's
// converter writes them; a byte-fallback BPE tokenizer.json (Llama 2's) as
// llama.cpp's SentencePiece vocabulary (scores: the negated rank of the
// first merge that makes each token).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "data/hf_tokenizer.h"
#include "io/gguf.h"

namespace tessera::data {

// Whether the file holds a vocabulary (tokenizer.ggml.model).
bool gguf_has_vocab(const io::GgufFile& f);
Result<std::unique_ptr<HfTokenizer>> gguf_tokenizer(const io::GgufFile& f);

// path: a folder with encoder.json and vocab.bpe (GPT-2's), a folder with
// tokenizer.json, or a tokenizer.json.
Status write_gguf_vocab(const std::string& path, io::GgufWriter& w);

}  // namespace tessera::data

// Hugging Face tokenizers: a `tokenizer.json` read and run as the Rust
// `tokenizers` crate runs it (docs/formats/tokenizer.md), exact against the
// reference implementation (@huggingface/tokenizers) on Llama 2, Llama 3,
// Llama 3.1/3.2 and Qwen3 files.
//
// Encoding, in the order the crate applies it:
//   1. added tokens (the file's "added_tokens") are found in the text first,
//      leftmost-longest, with their lstrip / rstrip / single_word flags;
//      special ones only when EncodeOptions::parse_special says so (else
//      their text is ordinary text);
//   2. each stretch of text between them is normalized (NFC, NFKC, NFD,
//      NFKD, Prepend, Replace, Lowercase, Strip, Sequence) and
//   3. pre-tokenized (ByteLevel, Split with a regular expression through
//      ICU, Metaspace, Digits, WhitespaceSplit, Sequence);
//   4. each pre-token is run through the model (BPE: merges in string or
//      pair form, byte_fallback, ignore_merges, unk_token, fuse_unk);
//   5. the post-processor (TemplateProcessing, ByteLevel, Sequence) adds
//      BOS/EOS when EncodeOptions::add_special_tokens.
// Decoding runs the decoder chain (ByteLevel, Metaspace, ByteFallback,
// Fuse, Strip, Replace, Sequence) over the ids' token strings.
//
// A component the loader does not implement (WordPiece, Unigram, a Bert
// post-processor, Split with invert, ...) is refused at load in one line
// naming it, never approximated. Input text that is not valid UTF-8 is
// first made valid as a UTF-8 decoder does (each maximal invalid sequence
// becomes U+FFFD), which is what a caller of the reference sees when it
// reads such a file as text.
//
// Thread safety: immutable after load(); every method is const and may be
// called from any number of threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace tessera::data {

struct EncodeOptions {
  bool add_special_tokens = false;  // the post-processor's BOS/EOS (HF's default is true)
  bool parse_special = false;       // special-token text becomes its id (HF: !split_special_tokens)
};

struct HfLoadOptions {
  // Llama 3's and Qwen's Split patterns matched by hand instead of by ICU
  // (the same matches, about 4x faster); false: every pattern through ICU,
  // for the test that holds the two equal.
  bool fast_split = true;
};

class HfTokenizer : public Tokenizer {
 public:
  // path: a tokenizer.json, or a folder holding one. The folder's
  // tokenizer_config.json, when present, gives the eos/bos token names
  // (eot() below). NotFound when the file is missing; InvalidArgument or
  // Corruption, one line naming the file and the field, for anything else.
  static Result<std::unique_ptr<HfTokenizer>> load(const std::string& path, const HfLoadOptions& options = {});
  // The same from text in memory: a tokenizer.json's bytes (path names it
  // in messages; name is name()) and a tokenizer_config.json's (empty for
  // none; cfg_path names it). data/gguf_vocab.h builds one from a GGUF
  // file's vocabulary.
  static Result<std::unique_ptr<HfTokenizer>> from_json(const std::string& path, const std::string& name,
                                                        std::string_view bytes, const std::string& cfg_path,
                                                        std::string_view cfg_bytes, const HfLoadOptions& options = {});
  ~HfTokenizer() override;

  // Tokenizer: ordinary text, no special tokens added or parsed
  // (non-special added tokens such as Qwen3's <think> are still matched:
  // they are words of the vocabulary).
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::vector<uint32_t> encode(std::string_view text, const EncodeOptions& options) const;
  // The decoder chain over the ids, as the crate's decode(ids,
  // skip_special_tokens) gives it (invalid UTF-8 in the result replaced by
  // U+FFFD as the crate does).
  std::string decode(std::span<const uint32_t> tokens) const override;
  std::string decode(std::span<const uint32_t> tokens, bool skip_special_tokens) const;
  // The bytes one id contributes in the middle of a text (no start-of-text
  // stripping), for streaming: a byte-level or byte-fallback id may be part
  // of a UTF-8 character, which the caller holds back until it is whole.
  std::string decode_token(uint32_t token) const override;
  int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }
  uint32_t eot() const override { return eot_; }
  std::string name() const override { return name_; }

  // The id of a token string (vocabulary or added token), -1 if none.
  int64_t token_id(std::string_view token) const;
  bool is_special(uint32_t id) const;
  const std::string& token_text(uint32_t id) const;  // its string in the file
  const std::string& path() const { return path_; }

  struct Impl;  // the parsed pipeline (hf_tokenizer.cc)

 private:
  HfTokenizer() = default;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> id_bytes_;  // id -> decode_token()
  uint32_t eot_ = 0;
  std::string name_, path_;
};

// `text` with every maximal invalid UTF-8 subsequence replaced by U+FFFD
// (the WHATWG / Unicode "maximal subpart" rule that TextDecoder and Rust's
// from_utf8_lossy follow). Valid text comes back unchanged.
std::string utf8_valid(std::string_view text);

}  // namespace tessera::data

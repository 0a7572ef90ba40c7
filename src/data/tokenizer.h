// Tokenizers: text (UTF-8 bytes) <-> token ids.
//
//   ByteTokenizer  vocab 256: each byte is its own token; end-of-text is 0.
//   Gpt2Tokenizer  OpenAI's GPT-2 byte-level BPE (vocab 50257, end-of-text
//                  50256), exactly as OpenAI's encoder.py / tiktoken's "gpt2"
//                  encode; read from encoder.json + vocab.bpe
//                  (scripts/fetch-data.sh puts them in data/raw/gpt2/).
//
// Thread safety: a tokenizer is immutable after construction; every method is
// const and may be called from any number of threads at once.
// Token ids are uint32_t (a Hugging Face vocabulary can pass 65,536: Llama 3
// has 128,256); token shards store them in 16 bits where they fit.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace tessera::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ordinary text -> ids. Special tokens written in the text (such as
  // "<|endoftext|>") are NOT recognised: they are encoded as the text they are.
  // Any bytes are accepted, including invalid UTF-8, and decode() gives them
  // back exactly (ByteTokenizer: except NUL, see below).
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  // Ids -> bytes. The result may be invalid UTF-8 when the ids cut a
  // character in two. Precondition (CHECKed): every id < vocab_size().
  virtual std::string decode(std::span<const uint32_t> tokens) const = 0;
  // The bytes of one id; same precondition.
  virtual std::string decode_token(uint32_t token) const = 0;
  virtual int vocab_size() const = 0;
  virtual uint32_t eot() const = 0;  // end-of-text id, between documents
  virtual std::string name() const = 0;  // "byte", "gpt2" or the tokenizer.json's folder name
};

// Bytes are tokens. End-of-text is id 0, which is byte 0 (NUL): encode maps
// NUL bytes in text to ' ' so that 0 only ever means end-of-text; decode(0)
// gives a NUL byte back.
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr uint16_t kEndOfText = 0;
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const uint32_t> tokens) const override;
  std::string decode_token(uint32_t token) const override;
  int vocab_size() const override { return 256; }
  uint32_t eot() const override { return kEndOfText; }
  std::string name() const override { return "byte"; }
};

// GPT-2 byte-level BPE. encode(): the text is split into pre-tokens by
// GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (Unicode classes from ICU: \p{L} = Lu Ll Lt Lm Lo, \p{N} = Nd Nl No,
// \s = White_Space; an invalid UTF-8 byte is one character of none of these
// classes), then each pre-token's UTF-8 bytes are merged pair by pair in
// vocab.bpe rank order.
class Gpt2Tokenizer : public Tokenizer {
 public:
  static constexpr int kVocabSize = 50257;
  static constexpr uint16_t kEndOfText = 50256;
  static constexpr std::string_view kEndOfTextText = "<|endoftext|>";

  // Reads dir/encoder.json and dir/vocab.bpe. NotFound if either is missing
  // (the message says to run scripts/fetch-data.sh or pass --vocab DIR);
  // Corruption for malformed JSON, a vocabulary that is not exactly ids
  // 0..50256, or malformed merges.
  static Result<std::unique_ptr<Gpt2Tokenizer>> load(const std::string& dir);

  std::vector<uint32_t> encode(std::string_view text) const override;
  // As encode(), but the literal "<|endoftext|>" becomes id 50256; the text
  // between occurrences is encoded as by encode().
  std::vector<uint32_t> encode_with_special(std::string_view text) const;
  std::string decode(std::span<const uint32_t> tokens) const override;
  std::string decode_token(uint32_t token) const override;
  int vocab_size() const override { return kVocabSize; }
  uint32_t eot() const override { return kEndOfText; }
  std::string name() const override { return "gpt2"; }

  // One merge of vocab.bpe: the pair (left, right) becomes `merged`; lower
  // rank merges first. Public only so that the .cc's helpers can name it.
  struct Merge {
    int32_t rank;
    uint16_t merged;
  };
  struct Scratch;  // per-call working buffers of the BPE (tokenizer.cc)

 private:
  Gpt2Tokenizer() = default;
  static uint32_t pair_key(uint16_t left, uint16_t right) { return (uint32_t{left} << 16) | right; }
  // Appends the BPE tokens of one pre-token (its raw bytes) to out.
  void bpe(std::string_view word, Scratch& scratch, std::vector<uint32_t>& out) const;
  void encode_into(std::string_view text, Scratch& scratch, std::vector<uint32_t>& out) const;

  std::array<uint16_t, 256> byte_token_{};           // byte -> its single-byte token
  std::vector<std::string> token_bytes_;             // id -> bytes, kVocabSize entries
  std::unordered_map<uint32_t, Merge> merges_;       // pair_key(left, right) -> merge
};

// "byte", "gpt2" (read from vocab_dir; "" means data/raw/gpt2), the path
// of a tokenizer.json or of a folder holding one (HfTokenizer,
// data/hf_tokenizer.h), or of a GGUF file (FILE.gguf: its vocabulary,
// data/gguf_vocab.h). InvalidArgument for any other name.
Result<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& name, const std::string& vocab_dir);

}  // namespace tessera::data

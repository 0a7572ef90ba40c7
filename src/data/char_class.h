// The character classes that the byte-level BPE pre-tokenizers' patterns
// distinguish (GPT-2's, Llama 3's, Qwen's): \p{L}, \p{N}, \s (Unicode
// White_Space, as Oniguruma's and the tokenizers crate's \s), and the rest.
// From ICU, looked up in a table for the Basic Multilingual Plane.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::data {

// kLetter: Lu Ll Lt Lm Lo. kNumber: Nd Nl No. kSpace: White_Space. kOther:
// [^\s\p{L}\p{N}], and also every byte that is not part of valid UTF-8.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

struct Char {
  CharClass cls;
  int len;  // bytes, 1..4
};

// The character starting at s[i] (i < s.size()). Strict UTF-8: overlong
// forms, surrogates, values above U+10FFFF and truncated sequences are
// invalid, and an invalid byte is a one-byte character of class kOther, so
// that every input splits into pre-tokens and round-trips byte for byte.
// Thread-safe (the table is built once, on first use).
Char char_at(std::string_view s, size_t i);

}  // namespace tessera::data

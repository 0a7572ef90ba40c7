// The 4-bit weight formats of the int4 tiers (docs/formats/int4.md):
// llama.cpp's Q4_0 and Q4_K blocks, byte for byte, so that a GGUF file's
// tensors of those types are these matrices as they are.
//
// A matrix (OC, C) is OC rows of C / block_elems(type) blocks, each row
// row_bytes(type, C) bytes, rows one after another.
//
//   Q4_0, 32 weights in 18 bytes: d (fp16), then 16 bytes whose low nibble
//   is weight j and high nibble weight j + 16; weight = (q - 8) * d.
//   Q4_K, 256 weights in 144 bytes: d and dmin (fp16), 12 bytes packing a
//   6-bit scale and a 6-bit min for each of 8 sub-blocks of 32, then 128
//   bytes: for each pair of sub-blocks (2p, 2p + 1) 32 bytes, the low
//   nibble in sub-block 2p, the high in 2p + 1; weight = d * sc * q -
//   dmin * m.
//
// The matmul's activations are quantized per block too (ops.inc,
// matmul_q4_forward): symmetric int8 with an fp32 scale, per 32 values for
// Q4_0 and per 256 for Q4_K, with the code sums of every 32. Pure
// functions: no state, callable from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "kernels/q4_type.h"

namespace tessera::q4 {

constexpr int kQ4_0Elems = 32, kQ4_0Bytes = 18;
constexpr int kQ4_KElems = 256, kQ4_KBytes = 144;
constexpr int kSubBlock = 32;  // Q4_K's sub-blocks; the activation sums' span

// The blocks an interleaved layout holds (Q4_0 or Q4_K); t itself otherwise.
inline Type rows_type(Type t) {
  return t == Type::kQ4_0x16 ? Type::kQ4_0 : t == Type::kQ4_Kx16 ? Type::kQ4_K : t;
}
inline bool interleaved(Type t) { return t != rows_type(t); }
inline bool is_k(Type t) { return rows_type(t) == Type::kQ4_K; }
inline int block_elems(Type t) { return is_k(t) ? kQ4_KElems : kQ4_0Elems; }
inline int block_bytes(Type t) { return is_k(t) ? kQ4_KBytes : kQ4_0Bytes; }
// A row of C weights (C a multiple of block_elems).
inline int64_t row_bytes(Type t, int64_t C) { return C / block_elems(t) * block_bytes(t); }
inline bool fits(Type t, int64_t C) { return C > 0 && C % block_elems(t) == 0; }
const char* type_name(Type t);  // "q4_0", "q4_k", "q4_0x16", "q4_kx16"
// The --dtype names of the int4 tiers: "int4" is Q4_0, "int4k" Q4_K; false
// for any other name.
inline bool dtype_type(std::string_view dtype, Type* t) {
  if (dtype == "int4") return *t = Type::kQ4_0, true;
  if (dtype == "int4k") return *t = Type::kQ4_K, true;
  return false;
}

// IEEE binary16 <-> fp32: the conversion up is exact; down rounds to the
// nearest (ties to even), overflowing to infinity.
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);

// Q4_K's packed 6-bit scale and min of sub-block j (0..7).
inline void scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// rows rows of C values (C a multiple of block_elems) into rows x
// row_bytes(t, C) bytes. Q4_0: llama.cpp's rounding (d = the value of the
// largest magnitude / -8). Q4_K: per sub-block a weighted least-squares
// search for the scale and min (as llama.cpp's), then both quantized to 6
// bits against the super-block's d and dmin.
void quantize_rows(Type t, uint8_t* dst, const float* src, int64_t rows, int64_t C);
// One row back to fp32: dst[c] = the weight the block holds.
void dequantize_row(Type t, float* dst, const uint8_t* src, int64_t C);

// The matmul's activations, one row of C values (ops.inc,
// matmul_q4_forward): per act_block(t) values an fp32 scale max|x| / 127
// (1 for zeros) and codes round(x / scale) in [-127, 127]; and the sum of
// every 32 codes. codes: C, scales: C / act_block(t), sums: C / 32.
inline int act_block(Type t) { return is_k(t) ? kQ4_KElems : kQ4_0Elems; }
void quantize_activations(Type t, const float* x, int64_t C, int8_t* codes, float* scales, int32_t* sums);

// The CPU kernel's layouts of a Q4_0 or Q4_K matrix (Type::kQ4_0x16,
// kQ4_Kx16): OC rows (a multiple of 16) in groups of 16, each group's
// blocks one after another, a block of the group being the 16 rows'
// blocks' bytes rearranged (16 x 18 = 288 bytes for Q4_0, 16 x 144 = 2304
// for Q4_K) so that one 64-byte load holds 16 rows x 4 inputs, a vpdpbusd
// per 4 inputs for 16 rows (8 rows, the 32 bytes of a half, on AVX2):
//   Q4_0x16: 16 fp16 scales, row r's at 2r (32 bytes), then 4 chunks
//   q = 0..3 of 64 bytes, byte 4r + j of chunk q holding weight (r, 4q + j)
//   in its low nibble and weight (r, 16 + 4q + j) in its high nibble.
//   Q4_Kx16: 16 fp16 d (32 bytes), 16 fp16 dmin (32 bytes), then the 12
//   bytes of packed 6-bit scales and mins as three 64-byte parts, part w
//   holding row r's bytes 4w .. 4w + 3 at 4r (the 32-bit words llama.cpp's
//   kmasks unpack, 16 rows a register), then for each pair of sub-blocks
//   p = 0..3 8 chunks c = 0..7 of 64 bytes, byte 4r + j of chunk (p, c)
//   being byte 32p + 4c + j of row r's codes: weight (r, 64p + 4c + j) in
//   its low nibble, (r, 64p + 32 + 4c + j) in its high nibble.
// The same bytes as the rows', moved (a group's in the same range of the
// matrix): pack and unpack are exact inverses, and dst may be src.
// t is the rows' type (Q4_0 or Q4_K) for pack, the interleaved type for
// unpack; x16_of gives the interleaved type of a rows' type.
inline Type x16_of(Type t) { return t == Type::kQ4_K ? Type::kQ4_Kx16 : Type::kQ4_0x16; }
inline bool fits_x16(Type t, int64_t OC, int64_t C) { return OC > 0 && OC % 16 == 0 && fits(rows_type(t), C); }
void pack_x16(Type t, uint8_t* dst, const uint8_t* src, int64_t OC, int64_t C);
void unpack_x16(Type t, uint8_t* dst, const uint8_t* src, int64_t OC, int64_t C);

// One error line for a row's blocks that no quantizer writes (scales that
// are not finite): GGUF files and int4 files are checked as they are read.
Status check_row(Type t, const uint8_t* row, int64_t C);

}  // namespace tessera::q4

#!/usr/bin/env bash
# llama.cpp's own quantized GGUF files, for tests/io/llamacpp_quantized_test.cc
# (tests/reference/llamacpp/). Real files from elsewhere: llama-quantize, built
# from the llama.cpp source that the npm package node-llama-cpp ships
# (bench/llamacpp_build.sh), quantizes a random one-layer Llama that Tessera's
# converter wrote in F32, as a user's llama.cpp would:
#   tiny-q4_k_m.gguf  Q4_K_M: Q4_K matrices, attn_v and ffn_down Q6_K
#                     (llama.cpp's use_more_bits: the last layer), output Q6_K,
#                     and attn_output Q6_K too (--tensor-type), so that a
#                     projection's permuted columns are requantized
#   tiny-q4_0.gguf    Q4_0: Q4_0 matrices and token_embd, output Q6_K
#   tiny-q6_k-deq.bin llama.cpp's own dequantization of every Q6_K tensor of
#                     tiny-q4_k_m.gguf (llama-quantize --allow-requantize to
#                     F32: ggml's dequantize_row_q6_K), float32 little-endian,
#                     the tensors in the order of tiny-q6_k-deq.txt (name and
#                     element count a line)
#   tiny-q4_k_s.gguf  Q4_K_S: Q4_K matrices, attn_v Q5_K (llama.cpp's choice
#                     for the first 4 layers' attn_v), output Q6_K
#   tiny-q5_k_m.gguf  Q5_K_M with attn_q Q5_0, attn_k Q5_1 and ffn_up Q4_1 (by
#                     --tensor-type): Q5_K matrices and token_embd, attn_v,
#                     ffn_down and output Q6_K: every other type llama-quantize
#                     writes into 4- and 5-bit files
#   tiny-q5-deq.bin   llama.cpp's dequantization of every Q5_K, Q5_0, Q5_1
#                     and Q4_1 tensor of tiny-q5_k_m.gguf, as
#                     tiny-q6_k-deq.bin (index tiny-q5-deq.txt)
# Regenerate (needs the build tools bench/llamacpp_build.sh needs; not CI):
#   bash tests/reference/make_llamacpp_quantized.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=tests/reference/llamacpp
tessera=$PWD/build/release/tessera
eval "$(bash bench/llamacpp_build.sh)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
# One layer, 256 wide (Q4_K's and Q6_K's super-blocks), grouped-query
# attention (4 heads of 64, 2 key/value heads), vocabulary 256.
"$tessera" synth model --preset tinyllama-1.1b --layers 1 --dim 256 --heads 4 --kv-heads 2 --mlp-hidden 256 \
  --vocab 256 --context 64 --dtype fp32 --seed 7 --out "$work/hf" >&2
"$tessera" quantize --weights "$work/hf" --out "$work/tiny-f32.gguf" --dtype f32 >&2
"$LLAMA_QUANTIZE" --tensor-type attn_output=q6_k "$work/tiny-f32.gguf" "$out/tiny-q4_k_m.gguf" Q4_K_M 1 >&2
"$LLAMA_QUANTIZE" "$work/tiny-f32.gguf" "$out/tiny-q4_0.gguf" Q4_0 1 >&2
"$LLAMA_QUANTIZE" "$work/tiny-f32.gguf" "$out/tiny-q4_k_s.gguf" Q4_K_S 1 >&2
"$LLAMA_QUANTIZE" --tensor-type attn_q=q5_0 --tensor-type attn_k=q5_1 --tensor-type ffn_up=q4_1 \
  "$work/tiny-f32.gguf" "$out/tiny-q5_k_m.gguf" Q5_K_M 1 >&2
"$LLAMA_QUANTIZE" --allow-requantize "$out/tiny-q4_k_m.gguf" "$work/deq.gguf" F32 1 >&2
"$LLAMA_QUANTIZE" --allow-requantize "$out/tiny-q5_k_m.gguf" "$work/deq5.gguf" F32 1 >&2
# The Q6_K tensors' names from the Q4_K_M file, their F32 values from
# deq.gguf; the Q5_K_M file's other types from deq5.gguf.
dump() {
python3 - "$@" <<'PY'
import struct, sys

def tensors(path):
    """{name: (ggml type, element count, absolute offset)} of a GGUF v3 file."""
    b = open(path, "rb").read()
    at = 0
    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, b, at)
        at += struct.calcsize("<" + fmt)
        return v[0]
    def string():
        nonlocal at
        n = take("Q"); s = b[at:at + n].decode(); at += n
        return s
    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def value(t):
        if t == 8: return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(sizes[t])
    assert b[:4] == b"GGUF" and struct.unpack_from("<I", b, 4)[0] == 3
    at = 8
    n_tensors, n_kv = take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        k = string(); v = value(take("I"))
        if k == "general.alignment": align = v
    infos = []
    for _ in range(n_tensors):
        name = string(); nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        t = take("I"); off = take("Q")
        count = 1
        for x in ne: count *= x
        infos.append((name, t, count, off))
    data = (at + align - 1) // align * align
    return b, {name: (t, count, data + off) for name, t, count, off in infos}

_, quant = tensors(sys.argv[1])
deq_bytes, deq = tensors(sys.argv[2])
F32 = 0
types = {int(t) for t in sys.argv[5].split(",")}
names = [n for n, (t, _, _) in quant.items() if t in types]
assert names, f"no tensor of types {types} in {sys.argv[1]}"
with open(sys.argv[3], "wb") as f, open(sys.argv[4], "w") as index:
    for n in names:
        t, count, off = deq[n]
        assert t == F32, (n, t)
        f.write(deq_bytes[off:off + 4 * count])
        index.write(f"{n} {count}\n")
PY
}
Q4_1=3 Q5_0=6 Q5_1=7 Q5_K=13 Q6_K=14  # ggml type ids
dump "$out/tiny-q4_k_m.gguf" "$work/deq.gguf" "$out/tiny-q6_k-deq.bin" "$out/tiny-q6_k-deq.txt" $Q6_K
dump "$out/tiny-q5_k_m.gguf" "$work/deq5.gguf" "$out/tiny-q5-deq.bin" "$out/tiny-q5-deq.txt" \
  $Q4_1,$Q5_0,$Q5_1,$Q5_K
ls -l "$out" >&2

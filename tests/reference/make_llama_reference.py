#!/usr/bin/python3
"""PyTorch oracle for Tessera's Llama-family tests.

Builds two tiny decoders in plain PyTorch, written from the equations of
Hugging Face's modeling_llama.py / modeling_qwen2.py (RMSNorm, rotate_half
rotary embedding with Llama 3's rope_scaling, SwiGLU, grouped-query attention
with repeat_kv, untied or tied head), writes each as a Hugging Face folder
(config.json + model.safetensors, HF tensor names) and what it computes on
tests/reference/tokens.bin: logits, loss, every gradient and 10 AdamW steps.
Also writes the Llama one again in BF16, sharded in two files with
model.safetensors.index.json, for the import/export round trip.

Regenerate with:
    apt-get install -y python3-torch
    /usr/bin/python3 tests/reference/make_llama_reference.py

Needs only torch (and the Python standard library). CI never runs this.
"""

import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "llama")

torch.manual_seed(1337)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
torch.set_default_dtype(torch.float32)

B, T = 4, 16
MAX_LR, MIN_LR, WARMUP, STEPS = 1e-3, 1e-4, 3, 10
WEIGHT_DECAY, BETA1, BETA2, ADAM_EPS = 0.1, 0.9, 0.95, 1e-8
GRAD_CLIP = 1.0
GREEDY_PROMPT, GREEDY_NEW = 8, 12

# GQA (4 query heads, 2 key/value heads), untied head, theta 500000 with
# Llama 3 scaling whose original context (16) puts the 8 frequencies of a
# 16-wide head in all three bands (kept, blended, divided by the factor).
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 99, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
}
# Qwen2: biases on q, k and v only, a tied head, multi-query (1 kv head).
QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1,
    "vocab_size": 99, "max_position_embeddings": 32, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "rope_scaling": None,
    "hidden_act": "silu", "tie_word_embeddings": True,
    "use_sliding_window": False, "sliding_window": 32, "torch_dtype": "float32",
}


def inv_freq_of(cfg):
    hs = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = cfg["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type") == "llama3":  # transformers' _compute_llama3_parameters
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, inv_l)
    return inv


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nh, self.kv = NH, cfg["num_key_value_heads"]
        self.hs = cfg.get("head_dim") or C // NH
        qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
        o_bias = cfg.get("attention_bias", False)
        self.q_proj = nn.Linear(C, NH * self.hs, bias=qkv_bias)
        self.k_proj = nn.Linear(C, self.kv * self.hs, bias=qkv_bias)
        self.v_proj = nn.Linear(C, self.kv * self.hs, bias=qkv_bias)
        self.o_proj = nn.Linear(NH * self.hs, C, bias=o_bias)

    def forward(self, x, cos, sin):
        Bb, Tt, _ = x.shape
        q = self.q_proj(x).view(Bb, Tt, self.nh, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(Bb, Tt, self.kv, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(Bb, Tt, self.kv, self.hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = self.nh // self.kv  # repeat_kv: query head h uses key/value head h // g
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
        mask = torch.triu(torch.ones(Tt, Tt, dtype=torch.bool), diagonal=1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bb, Tt, self.nh * self.hs)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, Fh = cfg["hidden_size"], cfg["intermediate_size"]
        b = cfg.get("mlp_bias", False)
        self.gate_proj = nn.Linear(C, Fh, bias=b)
        self.up_proj = nn.Linear(C, Fh, bias=b)
        self.down_proj = nn.Linear(Fh, C, bias=b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        self.tied = cfg["tie_word_embeddings"]
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.register_buffer("inv_freq", inv_freq_of(cfg), persistent=False)

    def forward(self, idx, targets=None):
        Tt = idx.shape[1]
        pos = torch.arange(Tt, dtype=torch.int64).float()
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = x @ w.t()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def init_weights(model):
    for n, p in model.named_parameters():
        with torch.no_grad():
            if n.endswith("layernorm.weight") or n == "model.norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.02)


def write_safetensors(path, tensors, dtype="F32"):
    header = {"__metadata__": {"format": "pt", "source": "tests/reference/make_llama_reference.py"}}
    blobs, offset = [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        if dtype == "BF16":
            data = t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            data = t.to(torch.float32).numpy().astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_shard(path):
    with open(path, "rb") as f:
        raw = f.read()
    hdr = struct.unpack("<256i", raw[:1024])
    assert hdr[0] == 20240520 and hdr[1] == 1
    return list(struct.unpack("<%dH" % hdr[2], raw[1024:]))


def lr_at(s):
    if s < WARMUP:
        return MAX_LR * (s + 1) / WARMUP
    ratio = (s - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (MAX_LR - MIN_LR)


def write_config(folder, cfg):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def build(name, cfg, tokens):
    folder = os.path.join(OUT, name)
    model = Decoder(cfg)
    init_weights(model)
    params = list(model.named_parameters())
    init_state = [(n, p.detach().clone()) for n, p in params]
    write_config(folder, cfg)
    write_safetensors(os.path.join(folder, "model.safetensors"), init_state)

    buf = torch.tensor(tokens[: B * T + 1], dtype=torch.long)
    x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
    model.zero_grad(set_to_none=True)
    logits, loss = model(x, y)
    loss.backward()
    expected = [("logits", logits.detach()), ("loss", loss.detach().view(1))]
    expected += [("grad." + n, p.grad.detach().clone()) for n, p in params]
    write_safetensors(os.path.join(folder, "expected.safetensors"), expected)
    init_loss = loss.item()

    # Greedy decoding from the first GREEDY_PROMPT tokens (the serving test's
    # oracle), with the initial weights: the argmax of each step's logits.
    seq = list(tokens[:GREEDY_PROMPT])
    with torch.no_grad():
        for _ in range(GREEDY_NEW):
            step_logits, _ = model(torch.tensor([seq], dtype=torch.long))
            seq.append(int(step_logits[0, -1].argmax()))
    greedy = {"prompt": seq[:GREEDY_PROMPT], "tokens": seq[GREEDY_PROMPT:]}

    with torch.no_grad():
        for (_, p), (_, t) in zip(params, init_state):
            p.copy_(t)
    decay = [p for n, p in params if p.dim() >= 2]
    no_decay = [p for n, p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=MAX_LR, betas=(BETA1, BETA2), eps=ADAM_EPS)
    losses, norms, lrs = [], [], []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = model(x, y)
        l.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], GRAD_CLIP)
        for group in opt.param_groups:
            group["lr"] = lr_at(s)
        opt.step()
        losses.append(l.item())
        norms.append(norm.item())
        lrs.append(lr_at(s))
    assert losses[0] == init_loss
    ref = {
        "batch": B, "seq": T, "loss": init_loss,
        "train": {"max_lr": MAX_LR, "min_lr": MIN_LR, "warmup": WARMUP, "steps": STEPS,
                  "weight_decay": WEIGHT_DECAY, "beta1": BETA1, "beta2": BETA2, "eps": ADAM_EPS,
                  "grad_clip": GRAD_CLIP, "losses": losses, "grad_norms": norms, "lrs": lrs},
        "parameters": sum(p.numel() for _, p in params),
        "greedy": greedy,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")
    print(f"{name}: loss {init_loss!r} (ln V = {math.log(cfg['vocab_size'])!r}), "
          f"{ref['parameters']} parameters, norms {[round(n, 3) for n in norms]}")
    return init_state


def main():
    tokens = read_shard(os.path.join(HERE, "tokens.bin"))
    state = build("llama_gqa", LLAMA, tokens)
    build("qwen2_mqa", QWEN2, tokens)
    # The Llama weights again in BF16, in two shards with an index.
    folder = os.path.join(OUT, "llama_gqa_bf16")
    write_config(folder, dict(LLAMA, torch_dtype="bfloat16"))
    half = len(state) // 2
    shards = [state[:half], state[half:]]
    weight_map, total = {}, 0
    for k, part in enumerate(shards):
        fname = f"model-{k + 1:05}-of-{len(shards):05}.safetensors"
        write_safetensors(os.path.join(folder, fname), part, dtype="BF16")
        for n, t in part:
            weight_map[n] = fname
            total += 2 * t.numel()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""PyTorch oracle for Tessera's C++ tests.

Builds a tiny GPT-2 in plain PyTorch (Hugging Face GPT2LMHeadModel parameter
layout and names), runs forward/backward, 10 AdamW training steps and an eval
pass, and writes small reference files next to this script.

Regenerate with:
    apt-get install -y python3-torch
    /usr/bin/python3 tests/reference/make_reference.py

Needs only torch (and the Python standard library). CI never runs this; it only
reads the committed outputs.
"""

import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------
torch.manual_seed(1337)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
torch.set_default_dtype(torch.float32)

CONFIG = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 64,
    "n_positions": 32,
    "vocab_size": 99,
}
B, T = 4, 16
BATCH_SEED = 42        # generator seed for tokens.bin
EVAL_SEED = 4242       # generator seed for eval.bin
EVAL_BATCHES = 3

MAX_LR, MIN_LR, WARMUP, STEPS = 1e-3, 1e-4, 3, 10
WEIGHT_DECAY, BETA1, BETA2, ADAM_EPS = 0.1, 0.9, 0.95, 1e-8
GRAD_CLIP = 1.0        # lowered below if clipping would never trigger

LN_EPS = 1e-5


# ---------------------------------------------------------------------------
# Model (GPT-2, HF layout: Conv1D weights are [in, out], y = x @ W + b)
# ---------------------------------------------------------------------------
def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class Conv1D(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class LayerNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n))
        self.bias = nn.Parameter(torch.empty(n))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, LN_EPS)


class Attention(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        Bx, Tx, C = x.shape
        nh = self.n_head
        hs = C // nh
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q = q.view(Bx, Tx, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(Bx, Tx, nh, hs).transpose(1, 2)
        v = v.view(Bx, Tx, nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(Bx, Tx, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.ln_1 = LayerNorm(C)
        self.attn = Attention(C, n_head)
        self.ln_2 = LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        self.wte = nn.Embedding(cfg["vocab_size"], C)
        self.wpe = nn.Embedding(cfg["n_positions"], C)
        self.h = nn.ModuleList([Block(C, cfg["n_head"]) for _ in range(cfg["n_layer"])])
        self.ln_f = LayerNorm(C)

    def forward(self, idx, targets=None):
        Bx, Tx = idx.shape
        pos = torch.arange(Tx, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()  # tied lm_head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def init_weights(model, cfg):
    proj_std = 0.02 / math.sqrt(2 * cfg["n_layer"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("ln_"):
                if name.endswith(".weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.05 * torch.randn_like(p))
            elif name.endswith("c_proj.weight"):
                p.normal_(0.0, proj_std)
            else:  # wte, wpe, c_attn/c_fc weights, all Conv1D biases
                p.normal_(0.0, 0.02)


# ---------------------------------------------------------------------------
# safetensors writer / reader (no safetensors package)
# ---------------------------------------------------------------------------
def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, float32 tensor) in the order the data is laid out."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, t in tensors:
        t = t.detach().to(torch.float32).contiguous().cpu()
        data = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header length not a multiple of 8"
    assert 8 + n <= len(raw)
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    expected_begin = 0
    for name, info in header.items():  # json keeps file order
        assert info["dtype"] == "F32", name
        b, e = info["data_offsets"]
        assert b == expected_begin, f"{name}: gap/overlap at {b}"
        numel = 1
        for d in info["shape"]:
            numel *= d
        assert e - b == 4 * numel, f"{name}: size mismatch"
        arr = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
        expected_begin = e
    assert expected_begin == len(data), "trailing bytes after last tensor"
    return out, meta


# ---------------------------------------------------------------------------
# llm.c token shard format
# ---------------------------------------------------------------------------
def write_shard(path, tokens):
    tokens = [int(t) for t in tokens]
    assert all(0 <= t < 65536 for t in tokens)
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def read_shard(path):
    with open(path, "rb") as f:
        raw = f.read()
    hdr = struct.unpack("<256i", raw[:1024])
    assert hdr[0] == 20240520 and hdr[1] == 1
    n = hdr[2]
    assert len(raw) == 1024 + 2 * n
    return list(struct.unpack("<%dH" % n, raw[1024:]))


# ---------------------------------------------------------------------------
def lr_at(s):
    if s < WARMUP:
        return MAX_LR * (s + 1) / WARMUP
    ratio = (s - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (MAX_LR - MIN_LR)


def make_batch(tokens, k=0):
    n = B * T
    buf = torch.tensor(tokens[k * n: k * n + n + 1], dtype=torch.long)
    return buf[:-1].view(B, T), buf[1:].view(B, T)


def main():
    global GRAD_CLIP
    cfg = CONFIG
    V = cfg["vocab_size"]

    model = GPT2(cfg)
    init_weights(model, cfg)
    params = list(model.named_parameters())
    init_state = [(n, p.detach().clone()) for n, p in params]

    # --- weights ---------------------------------------------------------
    meta = {"format": "pt", "source": "tests/reference/make_reference.py"}
    write_safetensors(os.path.join(HERE, "gpt2_tiny.safetensors"),
                      [("transformer." + n, t) for n, t in init_state], meta)
    npos = cfg["n_positions"]
    extra = [("h.0.attn.bias", torch.tril(torch.ones(npos, npos)).view(1, 1, npos, npos)),
             ("h.0.attn.masked_bias", torch.tensor(-1e4))]
    write_safetensors(os.path.join(HERE, "gpt2_tiny_noprefix.safetensors"),
                      init_state[:3] + extra + init_state[3:])
    with open(os.path.join(HERE, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # --- read-back check of the writer ----------------------------------
    back, back_meta = read_safetensors(os.path.join(HERE, "gpt2_tiny.safetensors"))
    assert back_meta == meta, back_meta
    assert list(back.keys()) == ["transformer." + n for n, _ in init_state]
    for n, t in init_state:
        assert torch.equal(back["transformer." + n], t), n
    back2, meta2 = read_safetensors(os.path.join(HERE, "gpt2_tiny_noprefix.safetensors"))
    assert meta2 is None
    assert back2["h.0.attn.masked_bias"].shape == torch.Size([])
    assert back2["h.0.attn.bias"].shape == (1, 1, npos, npos)
    for n, t in init_state:
        assert torch.equal(back2[n], t), n

    # --- data ------------------------------------------------------------
    g = torch.Generator().manual_seed(BATCH_SEED)
    tokens = torch.randint(0, V, (B * T + 1,), generator=g).tolist()
    write_shard(os.path.join(HERE, "tokens.bin"), tokens)
    assert read_shard(os.path.join(HERE, "tokens.bin")) == tokens
    ge = torch.Generator().manual_seed(EVAL_SEED)
    eval_tokens = torch.randint(0, V, (EVAL_BATCHES * B * T + 1,), generator=ge).tolist()
    write_shard(os.path.join(HERE, "eval.bin"), eval_tokens)
    assert read_shard(os.path.join(HERE, "eval.bin")) == eval_tokens

    x, y = make_batch(tokens)

    # --- eval at initial weights ------------------------------------------
    with torch.no_grad():
        eval_losses = [model(*make_batch(eval_tokens, k))[1].item() for k in range(EVAL_BATCHES)]
    eval_loss = float(sum(eval_losses) / EVAL_BATCHES)

    # --- forward + backward ---------------------------------------------
    model.zero_grad(set_to_none=True)
    logits, loss = model(x, y)
    loss.backward()
    expected = [("logits", logits.detach()), ("loss", loss.detach().view(1))]
    expected += [("grad." + n, p.grad.detach().clone()) for n, p in params]
    write_safetensors(os.path.join(HERE, "expected.safetensors"), expected)
    back3, _ = read_safetensors(os.path.join(HERE, "expected.safetensors"))
    for n, t in expected:
        assert torch.equal(back3[n], t), n
    init_loss = loss.item()

    # float64 cross-check (informational: how far float32 is from exact)
    m64 = GPT2(cfg).double()
    with torch.no_grad():
        for (n, p64), (_, p) in zip(m64.named_parameters(), params):
            p64.copy_(p.double())
    l64_logits, l64 = m64(x, y)
    l64.backward()
    d_logits = (l64_logits.detach() - logits.detach().double()).abs().max().item()
    d_grad = max(((p64.grad - p.grad.double()).abs().max() / p64.grad.abs().max()).item()
                 for (_, p64), (_, p) in zip(m64.named_parameters(), params))
    print(f"float32 vs float64: max |d logits| = {d_logits:.3e}, "
          f"max rel-to-max |d grad| = {d_grad:.3e}, |d loss| = {abs(l64.item() - init_loss):.3e}")

    # --- training ----------------------------------------------------------
    def train(clip):
        with torch.no_grad():
            for (_, p), (_, t) in zip(params, init_state):
                p.copy_(t)
        decay = [p for n, p in params if p.dim() >= 2]
        no_decay = [p for n, p in params if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": WEIGHT_DECAY},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=MAX_LR, betas=(BETA1, BETA2), eps=ADAM_EPS)
        losses, norms, lrs = [], [], []
        for s in range(STEPS):
            opt.zero_grad(set_to_none=True)
            _, l = model(x, y)
            l.backward()
            norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], clip)
            lr = lr_at(s)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            losses.append(l.item())
            norms.append(norm.item())
            lrs.append(lr)
        return losses, norms, lrs

    losses, norms, lrs = train(GRAD_CLIP)
    if not any(n > GRAD_CLIP for n in norms):
        GRAD_CLIP = 0.5
        losses, norms, lrs = train(GRAD_CLIP)
    assert any(n > GRAD_CLIP for n in norms), "clipping never triggers"
    assert losses[0] == init_loss, (losses[0], init_loss)
    for s in range(STEPS):
        flag = "clipped" if norms[s] > GRAD_CLIP else ""
        print(f"step {s}: lr {lrs[s]:.6e} loss {losses[s]!r} grad_norm {norms[s]!r} {flag}")

    ref = {
        "config": cfg,
        "batch": B,
        "seq": T,
        "loss": init_loss,
        "train": {
            "max_lr": MAX_LR, "min_lr": MIN_LR, "warmup": WARMUP, "steps": STEPS,
            "weight_decay": WEIGHT_DECAY, "beta1": BETA1, "beta2": BETA2, "eps": ADAM_EPS,
            "grad_clip": GRAD_CLIP,
            "losses": losses,
            "grad_norms": norms,
            "lrs": lrs,
        },
        "eval": {"batch": B, "seq": T, "batches": EVAL_BATCHES, "loss": eval_loss},
        "seeds": {"torch_manual_seed": 1337, "tokens": BATCH_SEED, "eval": EVAL_SEED},
        "torch_version": torch.__version__,
    }
    # json.dump uses repr() for floats: shortest string that round-trips exactly.
    with open(os.path.join(HERE, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")

    print(f"init loss {init_loss!r} (ln V = {math.log(V)!r}), eval loss {eval_loss!r}")
    print(f"grad_clip {GRAD_CLIP}")


if __name__ == "__main__":
    main()

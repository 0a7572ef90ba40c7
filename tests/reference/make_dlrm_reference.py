#!/usr/bin/python3
"""Writes dlrm_reference.json: a tiny DLRM in plain PyTorch (nn.EmbeddingBag,
nn.Linear), its inputs, weights, logits, loss, every gradient and 10 optimizer
steps, for tests/nn/dlrm_parity_test.cc. Run with Debian's /usr/bin/python3
(python3-torch); see README.md. CI never runs this script.

Model (docs/dlrm.md): bottom MLP with ReLU after every layer; sum-pooled
embedding bags; the dot interaction [x, <f_i, f_j> for j < i] with f_0 = x;
top MLP with ReLU after every layer but the last (one logit); mean
BCE-with-logits.

Optimizer steps (the same batch each step): the MLPs with plain SGD; the
tables with row-wise Adagrad (state[r] += mean(g_r^2); w_r -= lr g_r /
(sqrt(state[r]) + eps), FBGEMM's EXACT_ROWWISE_ADAGRAD) or plain SGD, on the
rows the batch touched.
"""
import json
import os

import torch

torch.manual_seed(1234)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

CFG = dict(num_dense=5, dim=4, bottom=[7, 4], top=[6], table_rows=[11, 7, 3], pooling="sum")
B = 6
# Bags: sample 1 of table 0 is empty; duplicates within and across samples.
IDS = [[3, 3, 9, 0, 3, 10, 9, 1, 2], [6, 0, 1, 2, 3, 4, 5, 6, 0], [2, 1, 0, 0, 2, 1]]
OFFSETS = [[0, 3, 3, 5, 6, 8, 9], [0, 1, 2, 3, 5, 7, 9], [0, 1, 2, 3, 4, 5, 6]]
LR_DENSE, LR_TABLE, EPS, STEPS = 0.1, 0.3, 1e-8, 10


class DLRM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        sizes = [CFG["num_dense"]] + CFG["bottom"]
        self.bottom = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.tables = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(e, CFG["dim"], mode=CFG["pooling"]) for e in CFG["table_rows"])
        F = 1 + len(CFG["table_rows"])
        sizes = [CFG["dim"] + F * (F - 1) // 2] + CFG["top"] + [1]
        self.top = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, dense, ids, offsets):
        x = dense
        for l in self.bottom:
            x = torch.relu(l(x))
        feats = [x] + [t(i, o[:-1]) for t, i, o in zip(self.tables, ids, offsets)]
        T = torch.stack(feats, dim=1)  # (B,F,D)
        Z = torch.bmm(T, T.transpose(1, 2))
        F = T.shape[1]
        li = [i for i in range(F) for j in range(i)]
        lj = [j for i in range(F) for j in range(i)]
        z = torch.cat([x, Z[:, li, lj]], dim=1)
        for k, l in enumerate(self.top):
            z = l(z)
            if k + 1 < len(self.top):
                z = torch.relu(z)
        return z.squeeze(1)


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


def dense_named(model):
    out = {}
    for name, layers in (("bottom", model.bottom), ("top", model.top)):
        for k, l in enumerate(layers):
            out[f"{name}.{k}.weight"] = l.weight
            out[f"{name}.{k}.bias"] = l.bias
    return out


model = DLRM()
with torch.no_grad():  # embeddings of a size comparable to the MLP outputs
    for t in model.tables:
        t.weight.uniform_(-0.5, 0.5)
dense = torch.log1p(torch.rand(B, CFG["num_dense"]) * 20)
labels = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
ids = [torch.tensor(i, dtype=torch.long) for i in IDS]
offsets = [torch.tensor(o, dtype=torch.long) for o in OFFSETS]
init_state = {k: v.clone() for k, v in model.state_dict().items()}

logits = model(dense, ids, offsets)
loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
loss.backward()

ref = {
    "config": CFG, "B": B,
    "batch": {"dense": flat(dense), "ids": IDS, "offsets": OFFSETS, "labels": flat(labels)},
    "params": {k: flat(v) for k, v in dense_named(model).items()},
    "tables": [flat(t.weight) for t in model.tables],
    "logits": flat(logits), "loss": float(loss),
    "grads": {k: flat(v.grad) for k, v in dense_named(model).items()},
    "table_grads": [],
}
for t, i in zip(model.tables, IDS):
    rows = sorted(set(i))
    ref["table_grads"].append({"rows": rows, "grads": flat(t.weight.grad[rows])})


def train(table_opt):
    model.load_state_dict(init_state)
    state = [torch.zeros(e) for e in CFG["table_rows"]]
    losses = []
    for _ in range(STEPS):
        model.zero_grad()
        l = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids, offsets), labels)
        l.backward()
        losses.append(float(l))
        with torch.no_grad():
            for p in dense_named(model).values():
                p -= LR_DENSE * p.grad
            for k, (t, i) in enumerate(zip(model.tables, IDS)):
                rows = torch.tensor(sorted(set(i)), dtype=torch.long)
                g = t.weight.grad[rows]
                if table_opt == "adagrad":
                    state[k][rows] += (g * g).mean(dim=1)
                    t.weight[rows] -= (LR_TABLE / (state[k][rows].sqrt() + EPS)).unsqueeze(1) * g
                else:
                    t.weight[rows] -= LR_TABLE * g
    return {"losses": losses, "params": {k: flat(v) for k, v in dense_named(model).items()},
            "tables": [flat(t.weight) for t in model.tables], "state": [flat(s) for s in state]}


ref["steps"] = {"lr_dense": LR_DENSE, "lr_table": LR_TABLE, "eps": EPS, "count": STEPS,
                "adagrad": train("adagrad"), "sgd": train("sgd")}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dlrm_reference.json")
with open(path, "w") as f:
    json.dump(ref, f, indent=1)
    f.write("\n")
print("wrote", path, "loss", float(loss))

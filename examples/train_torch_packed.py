"""Pretraining-style input: two token datasets mixed 1:1 by tokens, packed into [rows, seq_len]
windows, a small next-token model trained on them in PyTorch, and an exact resume.

Each dataset follows its own rule (dataset A: the next token is t + 1, dataset B: t + 2, modulo
the vocabulary); the loss masks every position whose next token is padding or starts another
document (`document_ids`), so a bigram model's loss falls from ln 64 towards ln 2 (it cannot
tell the datasets apart from one token, and they are mixed 1:1 by tokens). Half-way the packer's state (cursor and window) is checkpointed; a new packer
restored from it yields exactly the batches the first would have.

    python examples/train_torch_packed.py [WORKDIR]
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np
import torch

import zrecord

VOCAB = 64


def make_dataset(path, n_docs, step, lengths, seed):
    rng = np.random.default_rng(seed)
    docs = []
    for n in rng.integers(*lengths, n_docs):
        start = rng.integers(0, VOCAB)
        docs.append(((start + step * np.arange(n)) % VOCAB).astype(np.int32))
    with zrecord.RaggedWriter(path, "int32", 1, codec="zstd") as w:
        w.append(zrecord.RaggedBatch.from_records(docs))
    return zrecord.open(path).bind(zrecord.Allocator())


def make_packer(a, b, seq_len, rows):
    mix = zrecord.Mixture({"a": ({"tokens": a}, 1.0), "b": ({"tokens": b}, 1.0)}, batch_size=16, seed=3, by="tokens")
    return zrecord.Packer(mix, seq_len, rows=rows, lookahead=32, pad_id=0)


def loss_of(model, batch):
    tokens = torch.from_dlpack(batch["tokens"]).long()
    docs = torch.from_dlpack(batch["document_ids"])
    logits = model(tokens[:, :-1])
    target = tokens[:, 1:]
    # Predict only inside a document: the next token must belong to the same document.
    mask = (docs[:, :-1] >= 0) & (docs[:, 1:] == docs[:, :-1])
    return torch.nn.functional.cross_entropy(logits[mask], target[mask])


def train(root, steps=120, seq_len=64, rows=8):
    a = make_dataset(f"{root}/a", 400, 1, (4, 40), seed=0)    # short documents
    b = make_dataset(f"{root}/b", 100, 2, (40, 160), seed=1)  # long ones (some cut across rows)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    packer = make_packer(a, b, seq_len, rows)
    losses, resumed = [], False
    for step in range(steps):
        if step == steps // 2:
            state = packer.state_dict()  # saved with the model in a real run
            restored = make_packer(a, b, seq_len, rows)
            restored.load_state_dict(state)
            ahead = [torch.from_dlpack(next(restored)["tokens"]).clone() for _ in range(3)]
        batch = next(packer)
        if steps // 2 <= step < steps // 2 + 3:
            resumed = torch.equal(ahead[step - steps // 2], torch.from_dlpack(batch["tokens"]))
            assert resumed, "the restored packer must yield the same batches"
        loss = loss_of(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, packer.efficiency, resumed


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="zrecord-packed-")
    losses, efficiency, resumed = train(root)
    print(f"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}, packing efficiency {efficiency:.3f}, resumed exactly: {resumed}")


if __name__ == "__main__":
    main()

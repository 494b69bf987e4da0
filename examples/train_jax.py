"""Feed JAX from the zrecord Loader: batches leave the loader as DLPack tensors and go to the
device with ``jax.device_put`` (on CPU the array is imported without a copy), then a jitted
logistic-regression step runs on them.

    python examples/train_jax.py [WORKDIR]
"""

from __future__ import annotations

import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import zrecord


def make_dataset(root, n=4096, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(dim).astype(np.float32)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    y = (x @ w_true > 0).astype(np.float32)
    with zrecord.DenseWriter(f"{root}/x", "float32", (dim,), codec="zstd") as w:
        w.append(x)
    with zrecord.DenseWriter(f"{root}/y", "float32", (), codec="raw") as w:
        w.append(y)
    return n, dim


def to_device(parts):
    """Loader transform: one position's streams -> JAX arrays on the default device."""
    (p,) = parts
    device = jax.devices()[0]
    return {k: jax.device_put(jnp.from_dlpack(v), device) for k, v in p.items()}


@jax.jit
def step(params, x, y, lr=0.5):
    def loss_fn(params):
        w, b = params
        p = jax.nn.sigmoid(x @ w + b)
        return -jnp.mean(y * jnp.log(p + 1e-7) + (1 - y) * jnp.log(1 - p + 1e-7))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda a, g: a - lr * g, params, grads), loss


def train(root, steps=200, batch=128):
    n, dim = make_dataset(root)
    alloc = zrecord.Allocator()
    streams = {name: [zrecord.open(f"{root}/{name}").bind(alloc)] for name in ("x", "y")}
    # This host's shard of every epoch: an EpochPlan (the arithmetic the torch adapter uses too)
    # dealt to jax.process_count() hosts; full batches only, so the jitted step sees one shape.
    # A position from deal.position_after([steps] * hosts) resumes on another host count.
    plan = zrecord.EpochPlan(n, batch, "cyclic", seed=1, drop_last=True)
    stream = plan.deal(jax.process_count(), 1).stream(jax.process_index(), 0)
    loader = zrecord.Loader(streams, stream, workers=2, transform=to_device)
    params = (jnp.zeros(dim), jnp.zeros(()))
    losses = []
    with loader:
        for _ in range(steps):
            b = next(loader)
            params, loss = step(params, b["x"], b["y"])
            losses.append(float(loss))
    return losses


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="zrecord-jax-")
    losses = train(root)
    print(f"loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}")


if __name__ == "__main__":
    main()

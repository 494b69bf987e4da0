"""Mixtures and epoch plans: how fast the ids of a step come, how exactly a mixture holds its
weights, and what a seek costs, next to the peers' ways of doing the same, in one process.

Mixture (two sources of 1,000,000 and 250,000 records, weights 0.7 / 0.3, batches of 256):
- `zrecord.Mixture.batch(step)` (deterministic slot pattern, each source its own cyclic
  permutation per epoch);
- Grain `MapDataset.mix` of the two sources shuffled (`MapDataset.range(n).shuffle(seed)`),
  read by index, 256 indices per batch;
- NumPy: an IID coin per record (`rng.choice` with the weights), each source walking its own
  permutation (what a hand-written sampler does).
Reported: ids/s, and the largest deviation of source A's record count from 0.7 * records over
every window of 1, 16 and 256 consecutive batches (records), and the cost of reaching step 10^6.

Epoch plan (10M records, batches of 256, 8 ranks x 2 workers): rank 0's ids for a whole epoch,
`EpochPlan.deal(...).ids(...)` vs torch's `DistributedSampler` (a `randperm` of the whole epoch on
every rank), and the peak extra memory of each; and a resume half-way on another layout.

    python benches/python/mixture.py [--batches 4000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc

import numpy as np

import zrecord

NA, NB, WA, B = 1_000_000, 250_000, 0.7, 256


def deviation(is_a, windows=(1, 16, 256)):
    """Largest |count of A - WA * records| over every window of w batches, per w."""
    per_batch = is_a.reshape(-1, B).sum(axis=1).astype(np.float64)
    out = []
    for w in windows:
        c = np.concatenate([[0], np.cumsum(per_batch)])
        counts = c[w:] - c[:-w]
        out.append(np.max(np.abs(counts - WA * w * B)))
    return out


def timed(fn, batches):
    t0 = time.perf_counter()
    ids = fn(batches)
    return ids, batches * B / (time.perf_counter() - t0)


def zrecord_mixture(tmp):
    views = {}
    for name, n in (("a", NA), ("b", NB)):
        with zrecord.DenseWriter(f"{tmp}/{name}", np.uint8, (1,), "raw") as w:
            w.append(np.zeros((n, 1), np.uint8))
        views[name] = zrecord.DenseStore(f"{tmp}/{name}").bind(zrecord.Allocator())
    return zrecord.Mixture({"a": ({"x": views["a"]}, WA), "b": ({"x": views["b"]}, 1 - WA)}, batch_size=B, mode="cyclic", seed=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=4000)
    args = ap.parse_args()
    nb = args.batches
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        mix = zrecord_mixture(tmp)
        ids, rate = timed(lambda n: np.concatenate([mix.batch(k) for k in range(n)]), nb)
        t0 = time.perf_counter()
        mix.batch(1_000_000)
        seek = time.perf_counter() - t0
        rows.append(("zrecord Mixture", rate, deviation(ids < NA), seek))

    try:
        import grain

        a = grain.MapDataset.range(NA).shuffle(seed=1)
        b = grain.MapDataset.range(NB).shuffle(seed=2).map(lambda i: i + NA)
        mixed = grain.MapDataset.mix([a, b], [WA, 1 - WA])
        ids, rate = timed(lambda n: np.fromiter((mixed[i] for i in range(n * B)), np.int64, n * B), nb)
        t0 = time.perf_counter()
        _ = [mixed[1_000_000 * B + i] for i in range(B)]
        seek = time.perf_counter() - t0
        rows.append(("Grain MapDataset.mix", rate, deviation(ids < NA), seek))
    except ImportError:
        print("(grain is not installed: not measured)")

    def numpy_mix(n, start=0):
        rng = np.random.default_rng(1)
        pa, pb = rng.permutation(NA), rng.permutation(NB)
        ca = cb = 0
        out = []
        for _ in range(start + n):
            coin = rng.random(B) < WA
            k = int(coin.sum())
            ids = np.empty(B, np.int64)
            ids[coin] = pa[(ca + np.arange(k)) % NA]
            ids[~coin] = pb[(cb + np.arange(B - k)) % NB] + NA
            ca, cb = ca + k, cb + B - k
            out.append(ids)
        return np.concatenate(out[start:])

    ids, rate = timed(numpy_mix, nb)
    t0 = time.perf_counter()
    numpy_mix(1, start=20_000)  # replaying 20,000 steps; 10^6 would be 50x this
    seek = (time.perf_counter() - t0) * 50
    rows.append(("NumPy IID coins (replay to seek)", rate, deviation(ids < NA), seek))

    z = rows[0][1]
    print(f"Mixture: sources of {NA:,} and {NB:,} records, weights {WA} / {1 - WA:.1f}, batches of {B}, {nb} batches")
    print("| sampler | ids/s | zrecord x | max deviation (records), windows of 1 / 16 / 256 batches | reach step 10^6 |")
    print("|---|---:|---:|---|---:|")
    for name, rate, dev, seek in rows:
        print(f"| {name} | {rate:,.0f} | {z / rate:.1f}x | {dev[0]:.0f} / {dev[1]:.0f} / {dev[2]:.0f} | {seek * 1e3:,.2f} ms |")

    # Epoch plans: rank 0 of 8 (2 workers) for a whole epoch of 10M records.
    n, ranks, workers = 10_000_000, 8, 2
    plan = zrecord.EpochPlan(n, B, "cyclic", seed=1)
    tracemalloc.start()
    t0 = time.perf_counter()
    d = plan.deal(ranks, workers)
    got = [d.ids(0, w, i) for w in range(workers) for i in range(d.shard_len(0, w))]
    zt = time.perf_counter() - t0
    zmem = tracemalloc.get_traced_memory()[1] - sum(x.nbytes for x in got)
    tracemalloc.stop()
    z_ids = sum(len(x) for x in got)
    half = plan.deal(ranks, workers).position_after([d.rank_len(r) // 2 for r in range(ranks)])
    t0 = time.perf_counter()
    d3 = plan.deal(3, 1, half)
    d3.ids(0, 0, 0)
    zresume = time.perf_counter() - t0
    print(f"\nEpoch plan: {n:,} records, batches of {B}, rank 0 of {ranks} x {workers} workers, one epoch")
    print("| plan | rank 0's ids | time | ids/s | extra memory beyond the ids | resume half-way on 3 ranks |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| zrecord EpochPlan | {z_ids:,} | {zt * 1e3:,.1f} ms | {z_ids / zt:,.0f} | {max(zmem, 0) / 2**20:.1f} MiB | {zresume * 1e3:.2f} ms |")
    try:
        import torch
        from torch.utils.data import DistributedSampler

        class Len:
            def __len__(self):
                return n

        s = DistributedSampler(Len(), num_replicas=ranks, rank=0, shuffle=True, seed=1)
        tracemalloc.start()
        t0 = time.perf_counter()
        tidx = list(iter(s))
        tt = time.perf_counter() - t0
        tracemalloc.stop()
        # torch.randperm's tensor is not traced by tracemalloc: the whole epoch's int64 permutation.
        tmem = n * 8
        print(f"| torch DistributedSampler | {len(tidx):,} | {tt * 1e3:,.1f} ms | {len(tidx) / tt:,.0f} | {tmem / 2**20:.1f} MiB (randperm of the epoch) | no (same world size only) |")
        print(f"\nzrecord EpochPlan: rank 0's epoch {tt / zt:.1f}x faster than torch's DistributedSampler")
    except ImportError:
        print("(torch is not installed: not measured)")


if __name__ == "__main__":
    main()

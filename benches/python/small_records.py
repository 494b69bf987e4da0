"""Small dense records through the Python API, as a user calls it, with a consumer between batches.

Dense tokens (2 KiB records: 512 int32), 256 IID ids per batch: `np.from_dlpack(view[ids])` vs
NumPy memmap fancy indexing `mm[ids]` of the same rows, alternated in one process. Between
batches the "training step" busy-waits `gap` microseconds (0: a tight gather loop). Only the
gather is timed. Gaps longer than the gather crew's linger (200 us) are where helper threads
park between batches; a crew that has seen a steady period wakes ahead of the next batch.

    python benches/python/small_records.py [--records 200000] [--gaps 0,300,1000,3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def main() -> None:
    import zrecord

    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--gaps", default="0,300,1000,3000")
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--verify", type=int, default=1, help="bind with verify_checksums (the default)")
    args = ap.parse_args()
    n = args.records
    rng = np.random.default_rng(0)
    root = tempfile.mkdtemp(prefix="zrec-small-")
    path = os.path.join(root, "tokens")
    data = rng.integers(0, 50_000, (n, 512), dtype=np.int32)
    with zrecord.DenseWriter(path, np.int32, (512,), "raw") as w:
        w.append(data)
    np.save(os.path.join(root, "tokens.npy"), data)
    mm = np.load(os.path.join(root, "tokens.npy"), mmap_mode="r")
    view = zrecord.open(path).bind(zrecord.Allocator("cpu"), verify_checksums=bool(args.verify))
    batches = [rng.integers(0, n, 256) for _ in range(args.batches)]
    for b in batches[:8]:
        assert np.array_equal(np.from_dlpack(view[b]), data[b])
    del data
    for b in batches:  # every record read once: later reads are verified already
        np.from_dlpack(view[b])
        mm[b]

    def run(fn, gap_us: int) -> float:
        total = 0.0
        for b in batches:
            t0 = time.perf_counter()
            fn(b)
            t1 = time.perf_counter()
            total += t1 - t0
            if gap_us:
                end = t1 + gap_us * 1e-6
                while time.perf_counter() < end:
                    pass
        return total / len(batches)

    print(f"dense tokens, 2 KiB records, 256 IID ids per batch, {n} records, {os.cpu_count()} cores")
    print("| consumer gap | numpy memmap us/batch | zrecord us/batch | zrecord M records/s | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for gap in [int(g) for g in args.gaps.split(",")]:
        npy, zr = [], []
        for _ in range(3):
            npy.append(run(lambda b: mm[b], gap))
            zr.append(run(lambda b: np.from_dlpack(view[b]), gap))
        a, z = statistics.median(npy), statistics.median(zr)
        print(f"| {gap} us | {a * 1e6:.1f} | {z * 1e6:.1f} | {256 / z / 1e6:.2f} | {a / z:.2f}x |")


if __name__ == "__main__":
    main()

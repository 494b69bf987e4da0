"""The first batch after opening a store whose files are out of memory, against the steady
cold batches that follow (each started with the store's pages evicted again), in one process.

    python benches/python/first_cold.py [--records 200000] [--batches 30] [--rounds 3]

Dense tokens (int32[512], 2 KiB records) and ragged tokens (int32, lengths 16..512), raw and
zstd, IID batches of 256 ids. Each round writes nothing: the store's files are dropped from the
page cache (posix_fadvise DONTNEED), the store is opened afresh and bound, and the first
`view[ids]` + `np.from_dlpack` is timed; then `--batches` batches, each after
`release_pages(evict=True)`. The target (issue 37, item 6): the first batch within 3x a
steady cold one (the first gather decides cold mode from residency before reading).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import zrecord  # noqa: E402
from _harness import drop_cache  # noqa: E402

BATCH = 256


def build(root, n, rng):
    out = {}
    dense = rng.integers(0, 50_000, size=(n, 512), dtype=np.int32)
    lens = rng.integers(16, 513, size=n)
    cu = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    values = rng.integers(0, 50_000, size=int(cu[-1]), dtype=np.int32)
    for codec in ("raw", "zstd"):
        p = os.path.join(root, f"dense-{codec}")
        with zrecord.DenseWriter(p, np.int32, (512,), codec) as w:
            w.append(dense)
        out[("dense tokens", codec)] = p
        p = os.path.join(root, f"ragged-{codec}")
        with zrecord.RaggedWriter(p, np.int32, 1, codec) as w:
            w.append(zrecord.RaggedBatch(values, cu, lens.astype(np.uint64).reshape(-1, 1)))
        out[("ragged tokens", codec)] = p
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    alloc = zrecord.Allocator(pool_size_bytes=256 << 20)
    print("| store | codec | first batch ms (median of rounds) | steady cold batch ms (median) | first / steady | target |")
    print("|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(dir=os.environ.get("ZREC_BENCH_DIR")) as root:
        stores = build(root, args.records, rng)
        os.sync()  # dirty pages cannot be dropped from the page cache
        for (kind, codec), p in stores.items():
            firsts, steadies = [], []
            for _ in range(args.rounds):
                drop_cache(p)
                store = zrecord.open(p)
                view = store.bind(alloc)
                get = (lambda ids: np.from_dlpack(view[ids])) if kind.startswith("dense") else (lambda ids: np.from_dlpack(view[ids].values))
                ids = rng.integers(0, args.records, size=BATCH)
                t = time.perf_counter()
                get(ids)
                firsts.append(time.perf_counter() - t)
                for _ in range(args.batches):
                    store.release_pages(evict=True)
                    ids = rng.integers(0, args.records, size=BATCH)
                    t = time.perf_counter()
                    get(ids)
                    steadies.append(time.perf_counter() - t)
                del view, store
            f, s = statistics.median(firsts), statistics.median(steadies)
            print(f"| {kind} | {codec} | {f * 1e3:.2f} | {s * 1e3:.2f} | {f / s:.2f}x | {'met' if f <= 3 * s else 'missed'} (<= 3x) |")


if __name__ == "__main__":
    main()

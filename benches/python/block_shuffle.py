"""Block shuffles for cold and remote data: how random they are next to IID and a full
permutation, and what they buy when every batch starts with the data out of memory.

Randomness (1M ids, batches of 256, one epoch's worth of batches): distinct 64-record blocks a
batch touches (roughly the range reads it costs), the mean distance between consecutive ids as a
fraction of n (1/3 for independent uniform ids), the correlation between an id's position in
the epoch and the id (0 when the order carries no trace of the storage order), and the ids seen
twice within the epoch's batches (IID repeats, permutations do not).

Cold throughput: a raw store of 4 KiB records (`--records`), every batch gathered after the
store's pages were evicted (`release_pages(evict=True)`), records/s per order, in one process.

Remote (`--s3`): the same store on S3 (moto in server mode on loopback) read through a proxy that
delays every request by `--latency-ms`: records/s and requests per batch per order.

MosaicML Streaming's shuffles (`pip install mosaicml-streaming`; only its NumPy shuffle code is
used, so `--no-deps` suffices) are measured on the same data when installed: its default `py1e`
and `py1br` over shards of 16384 records (its default 64 MiB shard size at 4 KiB records) with its
default shuffle block of 2^18 samples, one canonical node, their ids driving the same reader.
Streaming itself downloads whole shards to a local cache, so its orders are built for shard
downloads, not range reads: the tables show what they cost a reader that fetches records.

    python benches/python/block_shuffle.py [--records 100000] [--seconds 3] [--s3 --latency-ms 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

import numpy as np

import zrecord

sys.path.insert(0, os.path.dirname(__file__))
from _harness import measure_cold  # noqa: E402

N, B = 1_000_000, 256

ORDERS = {
    "iid": dict(mode="iid"),
    "cyclic (full permutation)": dict(mode="cyclic"),
    "block 64 x window 16": dict(mode="block", block=64, window=16),
    "block 256 x window 64": dict(mode="block", block=256, window=64),
}


MOSAIC_SHARD = 16384


@functools.cache
def mosaic_get_shuffle():
    """MosaicML Streaming's `get_shuffle`, without importing the rest of its package."""
    import importlib.util
    import types

    try:
        spec = importlib.util.find_spec("streaming")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [path]
            sys.modules[name] = mod
    try:
        from streaming.base.shuffle import get_shuffle
    except ImportError:
        return None
    return get_shuffle


class MosaicOrder:
    """An epoch of MosaicML Streaming's shuffle, read as batches of B."""

    def __init__(self, algo, n, get_shuffle):
        sizes = np.full(n // MOSAIC_SHARD, MOSAIC_SHARD, np.int64)
        if n % MOSAIC_SHARD:
            sizes = np.append(sizes, n % MOSAIC_SHARD)
        self.ids = np.asarray(get_shuffle(algo, sizes, 1, 1, 0, 1 << 18), np.uint64)

    def batch(self, k):
        k %= len(self.ids) // B
        return self.ids[k * B:(k + 1) * B]


def orders():
    """Every order measured: zrecord's sampler modes, then MosaicML's shuffles if installed."""
    out = {name: (lambda n, kw=kw: zrecord.Sampler(n, B, kw["mode"], seed=1, block=kw.get("block", 64), window=kw.get("window", 16))) for name, kw in ORDERS.items()}
    get_shuffle = mosaic_get_shuffle()
    if get_shuffle is None:
        print("(MosaicML Streaming is not installed: its shuffles are not measured)")
    else:
        for algo in ("py1e", "py1br"):
            out[f"MosaicML {algo} (shards of {MOSAIC_SHARD}, block 2^18)"] = lambda n, a=algo: MosaicOrder(a, n, get_shuffle)
    return out


def randomness(make, n=N, batches=2000):
    s = make(n)
    ids = np.concatenate([s.batch(k) for k in range(batches)]).astype(np.int64)
    per_batch = ids.reshape(batches, B)
    blocks = np.mean([len(np.unique(b // 64)) for b in per_batch])
    gap = np.mean(np.abs(np.diff(ids))) / n
    pos = np.arange(len(ids))
    corr = abs(np.corrcoef(pos, ids)[0, 1])
    repeats = 1 - len(np.unique(ids)) / len(ids)
    return blocks, gap, corr, repeats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--s3", action="store_true", help="also measure the orders on S3 (moto) with injected latency")
    ap.add_argument("--latency-ms", type=float, default=5.0)
    args = ap.parse_args()
    print(f"Randomness: {N} ids, batches of {B}")
    every = orders()
    print("| order | blocks of 64 per batch | mean gap / n | corr(position, id) | repeated ids |")
    print("|---|---:|---:|---:|---:|")
    for name, make in every.items():
        blocks, gap, corr, rep = randomness(make)
        print(f"| {name} | {blocks:.1f} | {gap:.3f} | {corr:.4f} | {rep:.3%} |")

    n = args.records
    with tempfile.TemporaryDirectory(dir=os.environ.get("ZREC_BENCH_DIR")) as tmp:
        rng = np.random.default_rng(0)
        with zrecord.DenseWriter(f"{tmp}/x", np.uint8, (4096,), "raw") as w:
            for start in range(0, n, 4096):
                w.append(rng.integers(0, 255, (min(4096, n - start), 4096), dtype=np.uint8))
        store = zrecord.DenseStore(f"{tmp}/x")
        view = store.bind(zrecord.Allocator())
        print(f"\nCold gathers: {n} records of 4 KiB ({n * 4096 >> 20} MiB, raw), batches of {B}, pages evicted before each batch")
        print("| order | records/s | x iid |")
        print("|---|---:|---:|")
        base = None
        for name, make in every.items():
            s = make(n)
            batches = [s.batch(k) for k in range(64)]
            sec = measure_cold(lambda ids: view.gather(ids), lambda: store.release_pages(evict=True), batches, args.seconds)
            rate = B / sec
            base = base or rate
            print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x |")
        if args.s3:
            remote(f"{tmp}/x", n, args, every)


def remote(local, n, args, every):
    """The orders over S3 (moto on loopback) through a proxy adding latency to every request."""
    import boto3
    from moto.server import ThreadedMotoServer

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
    from _servers import DelayProxy

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    proxy = DelayProxy(port, args.latency_ms / 1000)
    s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="bench")
    for f in sorted(os.listdir(local)):
        s3.upload_file(os.path.join(local, f), "bench", f"x/{f}")
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "aws_region": "us-east-1", "allow_http": "true"}
    zrecord.set_storage_options("s3://bench", dict(creds, aws_endpoint=f"http://127.0.0.1:{proxy.port}"))
    view = zrecord.open("s3://bench/x").bind(zrecord.Allocator())
    print(f"\nS3 (moto on loopback) + {args.latency_ms:g} ms per request, batches of {B}")
    print("| order | records/s | x iid | requests/batch |")
    print("|---|---:|---:|---:|")
    base = None
    for name, make in every.items():
        s = make(n)
        view.gather(s.batch(0))
        proxy.reset()
        t0, k = time.perf_counter(), 0
        while k < 4 or time.perf_counter() - t0 < args.seconds:
            view.gather(s.batch(k + 1))
            k += 1
        rate = B * k / (time.perf_counter() - t0)
        reqs, _ = proxy.reset()
        base = base or rate
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x | {reqs / k:.1f} |")
    server.stop()


if __name__ == "__main__":
    main()

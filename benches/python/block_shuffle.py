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

    python benches/python/block_shuffle.py [--records 100000] [--seconds 3] [--s3 --latency-ms 5]
"""

from __future__ import annotations

import argparse
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


def randomness(kw, n=N, batches=2000):
    s = zrecord.Sampler(n, B, kw["mode"], seed=1, block=kw.get("block", 64), window=kw.get("window", 16))
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
    print("| order | blocks of 64 per batch | mean gap / n | corr(position, id) | repeated ids |")
    print("|---|---:|---:|---:|---:|")
    for name, kw in ORDERS.items():
        blocks, gap, corr, rep = randomness(kw)
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
        for name, kw in ORDERS.items():
            s = zrecord.Sampler(n, B, kw["mode"], seed=1, block=kw.get("block", 64), window=kw.get("window", 16))
            batches = [s.batch(k) for k in range(64)]
            sec = measure_cold(lambda ids: view.gather(ids), lambda: store.release_pages(evict=True), batches, args.seconds)
            rate = B / sec
            base = base or rate
            print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x |")
        if args.s3:
            remote(f"{tmp}/x", n, args)


def remote(local, n, args):
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
    for name, kw in ORDERS.items():
        s = zrecord.Sampler(n, B, kw["mode"], seed=1, block=kw.get("block", 64), window=kw.get("window", 16))
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

"""Remote gather: zrecord stores on S3 vs Lance (`pylance` take) on the same S3 server.

A real S3 server (moto in server mode) runs on loopback; reads go through a TCP proxy that
delays every request by --latency-ms (writes go straight to the server). Workloads: dense vision
(uint8[3,224,224]) and ragged tokens (int32, lengths 16..512), written once to both systems.
Each system gathers the same fresh IID batches of 256 (identical data checked first); the proxy
counts requests and bytes. Prints a Markdown table: records/s, ratio to Lance, requests per
batch, requests per 64 KiB returned, bytes fetched / bytes returned.

    python benches/python/remote.py [--latency-ms 5] [--seconds 5] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

import zrecord

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ragged_tokens, vision  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
from _servers import DelayProxy  # noqa: E402

BATCH = 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--gaps", default="131072,16384", help="zrecord_coalesce_gap values to measure (the first is the default)")
    args = ap.parse_args()
    import boto3
    import lance
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    direct = f"http://{host}:{port}"
    proxy = DelayProxy(port, args.latency_ms / 1000)
    via = f"http://127.0.0.1:{proxy.port}"
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "aws_region": "us-east-1", "allow_http": "true"}
    s3 = boto3.client("s3", endpoint_url=direct, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="bench")
    n_vis, n_tok = max(int(1000 * args.scale), BATCH), max(int(50_000 * args.scale), BATCH)
    rng = np.random.default_rng(0)
    rows = []
    for name in ("dense_vision", "ragged_tokens"):
        if name == "dense_vision":
            data = vision(n_vis)
            n = len(data)
            flat = pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), data[0].size)
            table = pa.table({"x": flat})
        else:
            values, cu = ragged_tokens(n_tok)
            n = len(cu) - 1
            table = pa.table({"x": pa.ListArray.from_arrays(pa.array(cu), pa.array(values))})
        # write: zrecord straight to the server, Lance too
        zrecord.set_storage_options("s3://bench/w", dict(creds, aws_endpoint=direct))
        zrecord.set_storage_options("s3://bench/r", dict(creds, aws_endpoint=via))
        if name == "dense_vision":
            with zrecord.DenseWriter(f"s3://bench/w/{name}", np.uint8, data.shape[1:], "raw") as w:
                w.append(data)
        else:
            for codec, suffix in (("raw", ""), ("zstd", "-zstd")):
                with zrecord.RaggedWriter(f"s3://bench/w/{name}{suffix}", np.int32, 1, codec) as w:
                    w.append(zrecord.RaggedBatch(values, cu, np.diff(cu).astype(np.uint64).reshape(-1, 1)))
        # the same objects, read through the proxy under another prefix name
        for obj in s3.list_objects_v2(Bucket="bench", Prefix=f"w/{name}")["Contents"]:
            s3.copy_object(Bucket="bench", Key="r/" + obj["Key"][2:], CopySource={"Bucket": "bench", "Key": obj["Key"]})
        lance.write_dataset(table, f"s3://bench/lance/{name}.lance", storage_options=dict(creds, aws_endpoint=direct), max_rows_per_file=1 << 30)
        gaps = [int(g) for g in args.gaps.split(",")]
        zviews = {}
        for g in gaps:
            zrecord.set_storage_options("s3://bench/r", dict(creds, aws_endpoint=via, zrecord_coalesce_gap=str(g)))
            zviews[g] = zrecord.open(f"s3://bench/r/{name}").bind(zrecord.Allocator())
        zr = zviews[gaps[0]]
        ld = lance.dataset(f"s3://bench/lance/{name}.lance", storage_options=dict(creds, aws_endpoint=via))
        batches = [np.sort(rng.integers(0, n, BATCH)) for _ in range(64)]

        def z_take(ids):
            return zr.gather(ids)

        def l_take(ids):
            return ld.take(ids, columns=["x"])

        # identical data first
        ids = batches[0]
        got = z_take(ids)
        want = l_take(ids).column("x")
        if name == "dense_vision":
            assert np.array_equal(np.from_dlpack(got).reshape(BATCH, -1), want.combine_chunks().flatten().to_numpy().reshape(BATCH, -1))
        else:
            assert np.array_equal(np.from_dlpack(got.values), want.combine_chunks().flatten().to_numpy())
        returned = BATCH * (data[0].nbytes if name == "dense_vision" else float(np.mean(np.diff(cu))) * 4)
        systems = [(f"zrecord raw (gap {g >> 10} KiB)", (lambda v: lambda ids: v.gather(ids))(zviews[g])) for g in gaps]
        if name == "ragged_tokens":
            zstd_view = zrecord.open(f"s3://bench/r/{name}-zstd").bind(zrecord.Allocator())
            assert np.array_equal(np.from_dlpack(zstd_view.gather(ids).values), np.from_dlpack(got.values))
            systems.append((f"zrecord zstd (gap {gaps[-1] >> 10} KiB)", zstd_view.gather))
        systems.append(("lance", l_take))
        for system, fn in systems:
            fn(batches[1])  # warm metadata caches
            proxy.reset()
            t0, k = time.perf_counter(), 0
            while k < 4 or time.perf_counter() - t0 < args.seconds:
                fn(batches[(k + 2) % len(batches)])
                k += 1
            dt = (time.perf_counter() - t0) / k
            reqs, back = proxy.reset()
            rows.append((name, system, BATCH / dt, reqs / k, reqs / k / (returned / 65536), back / k / returned))
    server.stop()
    print(f"\n### Remote gather, IID batches of {BATCH}, S3 (moto) on loopback + {args.latency_ms:g} ms per request\n")
    print("| workload | system | records/s | vs Lance | requests/batch | requests per 64 KiB | fetched/returned |")
    print("|---|---|---:|---:|---:|---:|---:|")
    lance_rate = {r[0]: r[2] for r in rows if r[1] == "lance"}
    for name, system, rate, rpb, r64, amp in rows:
        print(f"| {name} | {system} | {rate:,.0f} | {rate / lance_rate[name]:.2f}x | {rpb:.1f} | {r64:.2f} | {amp:.2f} |")


if __name__ == "__main__":
    main()

"""Python-level gather: zrecord vs NumPy mmap fancy indexing, LMDB, Arrow IPC (mmap + take)
and, where a Python >= 3.12 with `loaderx` is available, loaderx.

Workloads (generated deterministically): dense vision (uint8[3,224,224] image-like), dense
tokens (int32[512], Zipf ids), ragged tokens (int32, lengths 16..512, median ~129). Each
measurement gathers fresh IID batches of 256 for at least --seconds seconds, after checking
that every system returns identical data. Prints a Markdown table with ratios against the
fastest peer of the same codec class (raw vs uncompressed peers, zstd vs compressed peers).

    python benches/python/compare.py [--scale 1.0] [--seconds 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import zrecord

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import measure  # noqa: E402

BATCH = 256


# --------------------------------------------------------------------------- workloads
def vision(n, seed=7):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:224, 0:224].astype(np.float32)
    out = np.empty((n, 3, 224, 224), dtype=np.uint8)
    for i in range(n):
        gx, gy = rng.uniform(-1, 1, 2)
        img = np.empty((3, 224, 224), np.float32)
        for c in range(3):
            img[c] = rng.uniform(60, 180) + gx * xx * 0.4 + gy * yy * 0.4
        for _ in range(4):
            bx, by, r, amp = rng.uniform(0, 224), rng.uniform(0, 224), rng.uniform(8, 48), rng.uniform(-60, 60)
            d2 = (xx - bx) ** 2 + (yy - by) ** 2
            img += np.where(d2 < r * r, amp * (1 - d2 / (r * r)), 0)[None]
        img += rng.integers(-3, 4, size=img.shape)
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def zipf_tokens(size, rng, vocab=50_000):
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = ranks ** -1.1
    cdf = np.cumsum(p / p.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(size)), vocab - 1).astype(np.int32)


def dense_tokens(n, seed=8):
    return zipf_tokens((n, 512), np.random.default_rng(seed))


def ragged_tokens(n, seed=9):
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(np.exp(np.log(129) + 0.7 * rng.standard_normal(n))), 16, 512).astype(np.int64)
    values = zipf_tokens(int(lengths.sum()), rng)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return values, cu


# --------------------------------------------------------------------------- harness
class Dense:
    def __init__(self, name, data):
        self.name, self.data = name, data
        self.n = len(data)

    def expected(self, ids):
        return self.data[ids]


class Ragged:
    def __init__(self, name, values, cu):
        self.name, self.values, self.cu = name, values, cu
        self.n = len(cu) - 1

    def expected(self, ids):
        return np.concatenate([self.values[self.cu[i]:self.cu[i + 1]] for i in ids])


def build_zrecord(w, root):
    out = {}
    if isinstance(w, Dense):
        sample = [w.data[i].tobytes() for i in range(0, w.n, max(1, w.n // 2000))]
    else:
        sample = [w.values[w.cu[i]:w.cu[i + 1]].tobytes() for i in range(0, w.n, max(1, w.n // 2000))]
    d = zrecord.train_dict(sample)
    for codec in ("raw", "zstd", "zstd_dict"):
        p = os.path.join(root, f"zr-{w.name}-{codec}")
        kw = {"dict_bytes": d} if codec == "zstd_dict" else {}
        if isinstance(w, Dense):
            with zrecord.DenseWriter(p, w.data.dtype, w.data.shape[1:], codec, **kw) as wr:
                wr.append(w.data)
        else:
            shapes = np.diff(w.cu).astype(np.uint64).reshape(-1, 1)
            with zrecord.RaggedWriter(p, w.values.dtype, 1, codec, **kw) as wr:
                wr.append(zrecord.RaggedBatch(w.values, w.cu, shapes))
        out[codec] = p
    return out, d


def systems(w, root, alloc):
    """name -> (codec class, gather fn returning a NumPy-comparable result)."""
    res = {}
    stores, _ = build_zrecord(w, root)
    for codec, p in stores.items():
        for checked in (True, False):
            if codec != "raw" and not checked:
                continue
            view = zrecord.open(p).bind(alloc, verify_checksums=checked)
            name = f"zrecord {codec}" + ("" if checked else " (unchecked)")
            cls = "raw" if codec == "raw" else "compressed"
            if isinstance(w, Dense):
                res[name] = (cls, lambda ids, v=view: np.from_dlpack(v[ids]))
            else:
                res[name] = (cls, lambda ids, v=view: np.from_dlpack(v[ids].values))
    # NumPy .npy mmap + fancy indexing.
    if isinstance(w, Dense):
        npy = os.path.join(root, f"{w.name}.npy")
        np.save(npy, w.data)
        mm = np.load(npy, mmap_mode="r")
        res["numpy mmap"] = ("raw", lambda ids, mm=mm: mm[ids])
    else:
        vp, cp = os.path.join(root, f"{w.name}-values.npy"), os.path.join(root, f"{w.name}-cu.npy")
        np.save(vp, w.values)
        np.save(cp, w.cu)
        mv, mc = np.load(vp, mmap_mode="r"), np.load(cp, mmap_mode="r")
        res["numpy mmap"] = ("raw", lambda ids, mv=mv, mc=mc: np.concatenate([mv[mc[i]:mc[i + 1]] for i in ids]))
    # Arrow IPC, memory-mapped, take.
    try:
        import pyarrow as pa

        ipc = os.path.join(root, f"{w.name}.arrow")
        if isinstance(w, Dense):
            per = int(np.prod(w.data.shape[1:]))
            col = pa.FixedSizeListArray.from_arrays(pa.array(w.data.reshape(-1)), per)
        else:
            col = pa.ListArray.from_arrays(pa.array(w.cu), pa.array(w.values))
        table = pa.table({"data": col})
        with pa.OSFile(ipc, "wb") as f, pa.ipc.new_file(f, table.schema) as wr:
            for b in table.to_batches(max_chunksize=max(1, (64 << 20) // max(1, table.nbytes // max(1, table.num_rows)))):
                wr.write_batch(b)
        src = pa.memory_map(ipc, "r")
        t = pa.ipc.open_file(src).read_all().combine_chunks()
        shape = w.data.shape[1:] if isinstance(w, Dense) else None

        def arrow_take(ids, t=t, shape=shape):
            taken = t.column("data").take(pa.array(ids)).combine_chunks()
            flat = taken.flatten().to_numpy()
            return flat.reshape((len(ids),) + shape) if shape is not None else flat

        res["arrow ipc mmap take"] = ("raw", arrow_take)
    except ImportError:
        pass
    # LMDB, one key per record.
    try:
        import lmdb

        db = os.path.join(root, f"{w.name}.lmdb")
        env = lmdb.open(db, map_size=1 << 40, subdir=True, readahead=False)
        with env.begin(write=True) as txn:
            for i in range(w.n):
                v = w.data[i].tobytes() if isinstance(w, Dense) else w.values[w.cu[i]:w.cu[i + 1]].tobytes()
                txn.put(i.to_bytes(8, "big"), v)
        dtype = w.data.dtype if isinstance(w, Dense) else w.values.dtype

        def lmdb_get(ids, env=env, dtype=dtype):
            with env.begin(buffers=True) as txn:
                parts = [np.frombuffer(txn.get(int(i).to_bytes(8, "big")), dtype=dtype) for i in ids]
                out = np.concatenate(parts)
            return out.reshape((len(ids),) + w.data.shape[1:]) if isinstance(w, Dense) else out

        res["lmdb"] = ("raw", lmdb_get)
    except ImportError:
        pass
    return res


def loaderx_results(w, root, seconds):
    """Run loaderx under a Python >= 3.12 interpreter (if one with loaderx exists)."""
    py = os.environ.get("LOADERX_PYTHON")
    if not py or not shutil.which(py) and not os.path.exists(py):
        return {}
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loaderx_gather.py")
    data = os.path.join(root, f"lx-{w.name}.npz")
    if isinstance(w, Dense):
        np.savez(data, data=w.data)
    else:
        np.savez(data, values=w.values, cu=w.cu)
    try:
        out = subprocess.run([py, script, data, root, str(seconds), str(BATCH)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"loaderx run failed: {e}", file=sys.stderr)
        return {}
    if out.returncode != 0:
        print(f"loaderx run failed: {out.stderr[-2000:]}", file=sys.stderr)
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    root = args.workdir or tempfile.mkdtemp(prefix="zrecord-compare-")
    os.makedirs(root, exist_ok=True)
    k = lambda n: max(64, int(n * args.scale))  # noqa: E731
    workloads = []
    if not args.only or "dense_vision" in args.only:
        workloads.append(Dense("dense_vision", vision(k(2500))))
    if not args.only or "dense_tokens" in args.only:
        workloads.append(Dense("dense_tokens", dense_tokens(k(200_000))))
    if not args.only or "ragged_tokens" in args.only:
        workloads.append(Ragged("ragged_tokens", *ragged_tokens(k(200_000))))
    alloc = zrecord.Allocator("cpu")
    rows = []
    for w in workloads:
        rng = np.random.default_rng(1)
        # Fresh IID batches: enough distinct ids that the working set is the whole dataset.
        batches = [rng.integers(0, w.n, BATCH) for _ in range(4096)]
        systems_ = systems(w, root, alloc)
        for name, (cls, fn) in systems_.items():
            np.testing.assert_array_equal(fn(batches[0]), w.expected(batches[0]), err_msg=name)
        timings = {name: (cls, measure(fn, batches, args.seconds)) for name, (cls, fn) in systems_.items()}
        for name, (cls, t) in loaderx_results(w, root, args.seconds).items():
            timings[name] = (cls, t)
        best = {}
        for name, (cls, t) in timings.items():
            if not name.startswith("zrecord"):
                best[cls] = min(best.get(cls, (float("inf"), "")), (t, name))
        for name, (cls, t) in timings.items():
            peer = best.get(cls)
            ratio = f"{peer[0] / t:.2f}x vs {peer[1]}" if peer and name.startswith("zrecord") else ""
            rows.append((w.name, name, cls, BATCH / t, t * 1e6, ratio))
    # Python call overhead: one tiny record per call.
    p = os.path.join(root, "tiny")
    with zrecord.DenseWriter(p, np.int64, (), "raw") as wr:
        wr.append(np.arange(1024, dtype=np.int64))
    view = zrecord.DenseStore(p).bind(alloc)
    ids = [5]
    t = measure(lambda i: view[i], [ids], 0.5)
    print(f"\n## Python gather, IID batches of {BATCH}\n")
    print("| workload | system | class | records/s | us/batch | zrecord vs fastest peer |")
    print("|---|---|---|---:|---:|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:,.0f} | {r[4]:.1f} | {r[5]} |")
    print(f"\nPython call overhead (view[[i]] of one 8-byte record): {t * 1e6:.2f} us per call")
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

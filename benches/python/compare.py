"""Python-level gather: zrecord vs NumPy mmap fancy indexing, LMDB, Arrow IPC (mmap + take)
and, where a Python >= 3.12 with `loaderx` is available, loaderx.

Workloads (generated deterministically): dense vision (uint8[3,224,224] image-like), dense
tokens (int32[512], Zipf ids), ragged tokens (int32, lengths 16..512, median ~129). Each
measurement gathers fresh IID batches of 256 for about --seconds seconds (warm: in 8 rounds
interleaved across systems, each system's median round reported), after checking
that every system returns identical data. Prints a Markdown table with ratios against the
fastest peer of the same codec class (raw vs uncompressed peers, zstd vs compressed peers).

    python benches/python/compare.py [--scale 1.0] [--seconds 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import zrecord

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import drop_cache, measure, measure_cold, measure_rounds  # noqa: E402

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


def systems(w, root, alloc, cold=False):
    """name -> (codec class, gather fn returning a NumPy-comparable result, evict fn that takes
    the system's data out of memory: its mappings released, its files dropped from the page
    cache)."""
    res = {}
    stores, _ = build_zrecord(w, root)
    for codec, p in stores.items():
        for checked in (True, False):
            if codec != "raw" and not checked:
                continue
            store = zrecord.open(p)
            view = store.bind(alloc, verify_checksums=checked)
            name = f"zrecord {codec}" + ("" if checked else " (unchecked)")
            cls = "raw" if codec == "raw" else "compressed"
            evict = lambda s=store: s.release_pages(evict=True)  # noqa: E731
            if isinstance(w, Dense):
                res[name] = (cls, lambda ids, v=view: np.from_dlpack(v[ids]), evict)
            else:
                res[name] = (cls, lambda ids, v=view: np.from_dlpack(v[ids].values), evict)
    # NumPy .npy mmap + fancy indexing.
    if isinstance(w, Dense):
        npy = os.path.join(root, f"{w.name}.npy")
        np.save(npy, w.data)
        mm = np.load(npy, mmap_mode="r")

        def np_evict(mm=mm, npy=npy):
            mm._mmap.madvise(mmap.MADV_DONTNEED)
            drop_cache(npy)

        res["numpy mmap"] = ("raw", lambda ids, mm=mm: mm[ids], np_evict)
    else:
        vp, cp = os.path.join(root, f"{w.name}-values.npy"), os.path.join(root, f"{w.name}-cu.npy")
        np.save(vp, w.values)
        np.save(cp, w.cu)
        mv, mc = np.load(vp, mmap_mode="r"), np.load(cp, mmap_mode="r")

        def np_evict(mv=mv, mc=mc):
            for m in (mv, mc):
                m._mmap.madvise(mmap.MADV_DONTNEED)
            drop_cache(vp, cp)

        res["numpy mmap"] = ("raw", lambda ids, mv=mv, mc=mc: np.concatenate([mv[mc[i]:mc[i + 1]] for i in ids]), np_evict)
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
        # Warm: one chunk (combined once); cold: the batches as mapped (combining copies the
        # column into memory), the file mapped afresh after each eviction.
        arrow = {"t": None}

        def arrow_open(ipc=ipc, arrow=arrow):
            arrow["t"] = None
            t = pa.ipc.open_file(pa.memory_map(ipc, "r")).read_all()
            arrow["t"] = t if cold else t.combine_chunks()

        arrow_open()
        shape = w.data.shape[1:] if isinstance(w, Dense) else None

        def arrow_take(ids, arrow=arrow, shape=shape):
            taken = arrow["t"].column("data").take(pa.array(ids)).combine_chunks()
            flat = taken.flatten().to_numpy()
            return flat.reshape((len(ids),) + shape) if shape is not None else flat

        def arrow_evict(ipc=ipc, arrow=arrow):
            arrow["t"] = None
            drop_cache(ipc)
            arrow_open()

        res["arrow ipc mmap take"] = ("raw", arrow_take, arrow_evict)
    except ImportError:
        pass
    # LMDB, one key per record.
    try:
        import lmdb

        db = os.path.join(root, f"{w.name}.lmdb")
        lm = {"env": lmdb.open(db, map_size=1 << 40, subdir=True, readahead=False)}
        with lm["env"].begin(write=True) as txn:
            for i in range(w.n):
                v = w.data[i].tobytes() if isinstance(w, Dense) else w.values[w.cu[i]:w.cu[i + 1]].tobytes()
                txn.put(i.to_bytes(8, "big"), v)
        dtype = w.data.dtype if isinstance(w, Dense) else w.values.dtype

        def lmdb_get(ids, lm=lm, dtype=dtype):
            with lm["env"].begin(buffers=True) as txn:
                parts = [np.frombuffer(txn.get(int(i).to_bytes(8, "big")), dtype=dtype) for i in ids]
                out = np.concatenate(parts)
            return out.reshape((len(ids),) + w.data.shape[1:]) if isinstance(w, Dense) else out

        def lmdb_evict(lm=lm, db=db):
            lm["env"].close()
            drop_cache(db)
            lm["env"] = lmdb.open(db, map_size=1 << 40, subdir=True, readahead=False)

        res["lmdb"] = ("raw", lmdb_get, lmdb_evict)
    except ImportError:
        pass
    return res


def loaderx_results(w, root, seconds, cold=False):
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
        out = subprocess.run([py, script, data, root, str(seconds), str(BATCH)] + (["cold"] if cold else []), capture_output=True, text=True, timeout=900)
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
    ap.add_argument("--cold", action="store_true", help="evict each system's data from memory before every batch")
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
        systems_ = systems(w, root, alloc, args.cold)
        for name, (cls, fn, _) in systems_.items():
            np.testing.assert_array_equal(fn(batches[0]), w.expected(batches[0]), err_msg=name)
        if args.cold:
            # Write back what building the systems left dirty: dirty pages cannot be dropped
            # from the page cache, and writeback would compete with the reads measured.
            os.sync()
            timings = {name: (cls, measure_cold(fn, evict, batches, args.seconds)) for name, (cls, fn, evict) in systems_.items()}
        else:
            per_call = measure_rounds({name: fn for name, (_, fn, _) in systems_.items()}, batches, args.seconds)
            timings = {name: (cls, per_call[name]) for name, (cls, _, _) in systems_.items()}
        for name, (cls, t) in loaderx_results(w, root, args.seconds, args.cold).items():
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
    print(f"\n## Python gather, IID batches of {BATCH}{' (cold: data evicted before every batch)' if args.cold else ''}\n")
    print("| workload | system | class | records/s | us/batch | zrecord vs fastest peer |")
    print("|---|---|---|---:|---:|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:,.0f} | {r[4]:.1f} | {r[5]} |")
    print(f"\nPython call overhead (view[[i]] of one 8-byte record): {t * 1e6:.2f} us per call")
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

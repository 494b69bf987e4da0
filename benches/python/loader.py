"""End-to-end loader throughput and peak memory: zrecord Loader vs torch DataLoader (2 workers
over one .npy mmap, packed collation for ragged; only when torch is installed) vs the PyPI
loaderx Loader (when LOADERX_PYTHON names a Python >= 3.12 with loaderx). Dense vision
(2,500 x uint8[3,224,224]) and ragged tokens (100,000 sequences), batch 256, IID, a 200-batch
pass after 10 warm-up batches, transform to torch tensors (NumPy arrays when torch is absent).
The timed pass runs alone; peak PSS of the process tree is then sampled every 10 ms during a
second pass of the same length (sampling slows the process it samples). zrecord configurations
run --repeats times in fresh processes, interleaved, and report their median run.

Besides the bare gather loop (the baseline), two reference rows: the same loop holding its last
8 batches (the memory a loader with workers=2, prefetch=4 has in flight: regions rotate instead
of one cached region being rewritten), and a consumer busy 2 ms (dense) / 0.2 ms (tokens) per
step with the GIL released, where workers overlap gathers with the consumer; those rows are
compared with the gather loop under the same consumer.

    python benches/python/loader.py [--batches 200] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import zrecord

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (workload generators)
from _harness import PeakPss  # noqa: E402

BATCH = 256


def to_arrays(shards):
    try:
        import torch

        conv = torch.from_dlpack
    except ImportError:
        conv = np.from_dlpack
    s = shards[0]
    v = s["data"]
    if isinstance(v, zrecord.RaggedBatch):
        return conv(v.values), conv(v.cu_seqlens)
    return conv(v)


def mem_of(mem):
    return [mem.peak, mem.peaks["Pss_Anon"], mem.peaks["Pss_File"]]


def timed_then_sampled(step, batches):
    """[records/s, peak PSS, peak anon PSS, peak file PSS]: `batches` calls of step() timed
    alone, then as many again with the PSS sampler running (reading smaps_rollup walks the
    process's page tables under its mmap lock: timing with it running halved the measured rate
    of the loaders that map their data)."""
    t = time.perf_counter()
    for _ in range(batches):
        step()
    dt = time.perf_counter() - t
    with PeakPss(os.getpid()) as mem:
        for _ in range(batches):
            step()
    return [batches * BATCH / dt] + mem_of(mem)


def consume(busy_us):
    """A consumer step: nothing, or `busy_us` microseconds of waiting with the GIL released (what
    a training step on an accelerator looks like to the loader's process)."""
    if busy_us:
        return lambda batch: time.sleep(busy_us / 1e6)
    return lambda batch: None


def run_zrecord(path, n, batches, workers, busy_us=0):
    store = zrecord.open(path)
    alloc = zrecord.Allocator("cpu")
    loader = zrecord.Loader({"data": [store.bind(alloc)]}, zrecord.Sampler(n, BATCH, "iid", seed=1),
                            workers=workers, prefetch=4, transform=to_arrays)
    for _ in range(10):
        next(loader)
    step = consume(busy_us)
    out = timed_then_sampled(lambda: step(next(loader)), batches)
    loader.close()
    return out


def run_gather(path, n, batches, hold=1, busy_us=0):
    """The baseline a loader is measured against: the same sampler's batches gathered straight
    from a view and passed through the same transform, on the calling thread. With `hold` > 1
    the last `hold` batches stay alive, as a prefetching loader's batches in flight do (their
    regions rotate through memory instead of one region being rewritten while still cached)."""
    store = zrecord.open(path)
    view = store.bind(zrecord.Allocator("cpu"))
    sampler = zrecord.Sampler(n, BATCH, "iid", seed=1)
    ids = [np.asarray(sampler.batch(s)) for s in range(2 * batches + 10)]
    held = collections.deque(maxlen=hold)
    for s in range(10):
        held.append(to_arrays([{"data": view[ids[s]]}]))
    at = iter(range(10, 2 * batches + 10))
    step = consume(busy_us)

    def one():
        held.append(to_arrays([{"data": view[ids[next(at)]]}]))
        step(held[-1])

    return timed_then_sampled(one, batches)


def prepare_torch(w, root):
    if isinstance(w, compare.Dense):
        np.save(os.path.join(root, "torch.npy"), w.data)
    else:
        np.save(os.path.join(root, "tv.npy"), w.values)
        np.save(os.path.join(root, "tc.npy"), w.cu)


def run_torch(kind, root, n, batches):
    try:
        import torch
        from torch.utils.data import DataLoader, Dataset
    except ImportError:
        return None
    if kind == "dense":
        p = os.path.join(root, "torch.npy")

        class D(Dataset):
            def __init__(self):
                self.mm = None

            def __len__(self):
                return n

            def __getitem__(self, i):
                if self.mm is None:
                    self.mm = np.load(p, mmap_mode="r")
                return torch.from_numpy(np.array(self.mm[i]))

        collate = None
    else:
        vp, cp = os.path.join(root, "tv.npy"), os.path.join(root, "tc.npy")

        class D(Dataset):
            def __init__(self):
                self.v = self.c = None

            def __len__(self):
                return n

            def __getitem__(self, i):
                if self.v is None:
                    self.v, self.c = np.load(vp, mmap_mode="r"), np.load(cp, mmap_mode="r")
                return torch.from_numpy(np.array(self.v[self.c[i]:self.c[i + 1]]))

        def collate(items):
            lens = torch.tensor([len(x) for x in items])
            return torch.cat(items), torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)

    sampler = torch.utils.data.RandomSampler(range(n), replacement=True, num_samples=(2 * batches + 20) * BATCH)
    dl = DataLoader(D(), batch_size=BATCH, sampler=sampler, num_workers=2, collate_fn=collate)
    it = iter(dl)
    for _ in range(10):
        next(it)
    out = timed_then_sampled(lambda: next(it), batches)
    del it, dl
    return out


LOADERX = r"""
import json, os, sys, time, threading
import numpy as np
from loaderx import Allocator, Loader
from loaderx.zrecord import DenseStore, DenseWriter, RaggedStore, RaggedWriter, RaggedBatch
from loaderx.sampler import Sampler
sys.path.insert(0, sys.argv[4])
from _harness import PeakPss
data, root, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
z = np.load(data)
p = os.path.join(root, "lx-store")
if "data" in z:
    d = z["data"]; n = len(d)
    with DenseWriter(p, d.dtype, d.shape[1:], codec="raw") as w: w.append(d)
    store = DenseStore(p)
else:
    v, cu = z["values"], z["cu"]; n = len(cu) - 1
    with RaggedWriter(p, v.dtype, ndim=1, codec="raw") as w:
        w.append(RaggedBatch(v, cu, np.diff(cu).astype(np.uint32).reshape(-1, 1)))
    store = RaggedStore(p)
def tr(shards):
    x = shards[0]["data"]
    return np.from_dlpack(x.values) if hasattr(x, "values") else np.from_dlpack(x)
with Allocator("cpu") as a:
    loader = Loader({"data": [store.bind(a)]}, Sampler(n, 256, Sampler.Mode.IID, seed=1), transform=tr)
    for _ in range(10): next(loader)
    t = time.perf_counter()
    for _ in range(batches): next(loader)
    dt = time.perf_counter() - t
    with PeakPss(os.getpid()) as mem:
        for _ in range(batches): next(loader)
    loader.close()
print(json.dumps([batches * 256 / dt, mem.peak, mem.peaks["Pss_Anon"], mem.peaks["Pss_File"]]))
"""


def run_loaderx(w, root, batches):
    py = os.environ.get("LOADERX_PYTHON")
    if not py:
        return None
    data = os.path.join(root, "lx.npz")
    if isinstance(w, compare.Dense):
        np.savez(data, data=w.data)
    else:
        np.savez(data, values=w.values, cu=w.cu)
    r = subprocess.run([py, "-c", LOADERX, data, root, str(batches), os.path.dirname(os.path.abspath(__file__))],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print("loaderx failed:", r.stderr[-800:], file=sys.stderr)
        return None
    return tuple(json.loads(r.stdout.strip().splitlines()[-1]))


def fresh(what, path, n, batches, extra, torch_python=None):
    """Run one backend in a fresh interpreter; returns (records/s, peak PSS) or None."""
    py = torch_python if (what == "torch" and torch_python) else sys.executable
    r = subprocess.run([py, os.path.abspath(__file__), "--run", what, path, str(n), str(batches), str(extra)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{what} run failed: {r.stderr[-800:]}", file=sys.stderr)
        return None
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return None if out is None else tuple(out)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--run":
        what, path, n, batches, extra = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        if what == "zrecord":
            workers, busy = (int(x) for x in extra.split(":"))
            print(json.dumps(run_zrecord(path, n, batches, workers, busy)))
        elif what == "gather":
            hold, busy = (int(x) for x in extra.split(":"))
            print(json.dumps(run_gather(path, n, batches, hold, busy)))
        else:
            print(json.dumps(run_torch(extra, path, n, batches)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--torch-python", default=None, help="interpreter with torch (and zrecord) installed")
    ap.add_argument("--repeats", type=int, default=3, help="fresh-process runs of each zrecord configuration, interleaved; the median is reported")
    args = ap.parse_args()
    k = lambda n: max(BATCH, int(n * args.scale))  # noqa: E731
    rows = []
    for w in (compare.Dense("dense_vision", compare.vision(k(2500))), compare.Ragged("ragged_tokens", *compare.ragged_tokens(k(100_000)))):
        with tempfile.TemporaryDirectory(prefix="zrecord-loader-") as root:
            p = os.path.join(root, "zr")
            if isinstance(w, compare.Dense):
                with zrecord.DenseWriter(p, w.data.dtype, w.data.shape[1:], "raw") as wr:
                    wr.append(w.data)
            else:
                with zrecord.RaggedWriter(p, w.values.dtype, 1, "raw") as wr:
                    wr.append(zrecord.RaggedBatch(w.values, w.cu, np.diff(w.cu).astype(np.uint64).reshape(-1, 1)))
            # Every backend runs in a fresh process, so peak PSS counts only what it holds.
            # A pass of 200 token batches lasts ~15 ms: token workloads run 10x the batches
            # (torch's DataLoader, 30-60x slower, keeps --batches).
            nb = args.batches if isinstance(w, compare.Dense) else 10 * args.batches
            # The zrecord configurations run `--repeats` times, interleaved (a shared VM's memory
            # speed drifts over seconds), each reported as its median run.
            configs = {"zrecord view gather + transform (baseline)": ("gather", "1:0"),
                       "zrecord view gather, last 8 batches held": ("gather", "8:0")}
            configs.update({f"zrecord (workers={wk})": ("zrecord", f"{wk}:0") for wk in (0, 2, 4)})
            # A consumer busy 2 ms per step (dense vision) / 0.2 ms (tokens), GIL released: what
            # workers are for (the bare gather loop and workers=0 wait for each gather).
            busy = 2 if isinstance(w, compare.Dense) else 0.2
            busy_us = int(busy * 1000)
            configs.update({f"consumer busy {busy} ms/step: gather loop": ("gather", f"1:{busy_us}"),
                            f"consumer busy {busy} ms/step: workers=0": ("zrecord", f"0:{busy_us}"),
                            f"consumer busy {busy} ms/step: workers=2": ("zrecord", f"2:{busy_us}")})
            runs = {name: [] for name in configs}
            for _ in range(args.repeats):
                for name, (what, extra) in configs.items():
                    r = fresh(what, p, w.n, nb, extra, args.torch_python)
                    if r is not None:
                        runs[name].append(r)
            res = {name: sorted(rs)[len(rs) // 2] if rs else None for name, rs in runs.items()}
            prepare_torch(w, root)
            kind = "dense" if isinstance(w, compare.Dense) else "ragged"
            res["torch DataLoader (2 workers)"] = fresh("torch", root, w.n, args.batches, kind, args.torch_python)
            res["loaderx Loader"] = run_loaderx(w, root, nb)
            for name, r in res.items():
                if r is not None:
                    rows.append((w.name, name, *r))
    print("| workload | loader | records/s | x gather loop | peak PSS MiB | peak anon PSS MiB | peak file PSS MiB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    # Busy-consumer rows are compared with the gather loop under the same consumer.
    base = {(r[0], "busy" in r[1]): r[2] for r in rows if "baseline" in r[1] or "busy" in r[1] and "gather loop" in r[1]}
    for r in rows:
        key = (r[0], "busy" in r[1])
        ratio = f"{r[2] / base[key]:.2f}x" if key in base else ""
        print(f"| {r[0]} | {r[1]} | {r[2]:,.0f} | {ratio} | {r[3] / 2**20:.0f} | {r[4] / 2**20:.0f} | {r[5] / 2**20:.0f} |")


if __name__ == "__main__":
    main()

"""Sampler draw time: zrecord.Sampler (IID, cyclic) vs NumPy Generator.integers (IID) and
Generator.permutation (cyclic, amortised per batch), and the PyPI loaderx sampler when
LOADERX_PYTHON names a Python >= 3.12 with loaderx installed. 1M ids, batch 32..4096.

    python benches/python/sampler.py [--draws 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np

import zrecord

N = 1_000_000
SIZES = [32, 128, 512, 1024, 4096]

LOADERX = r"""
import json, sys, time
from loaderx.sampler import Sampler
draws = int(sys.argv[1]); out = {}
for b in [32, 128, 512, 1024, 4096]:
    for name, mode in (("iid", Sampler.Mode.IID), ("cyclic", Sampler.Mode.CYCLIC)):
        s = Sampler(1_000_000, b, mode, seed=1)
        for _ in range(100): s.next()
        t = time.perf_counter()
        for _ in range(draws): s.next()
        out[f"{name}/{b}"] = (time.perf_counter() - t) / draws
print(json.dumps(out))
"""


def per_draw(fn, draws):
    for _ in range(100):
        fn()
    t = time.perf_counter()
    for _ in range(draws):
        fn()
    return (time.perf_counter() - t) / draws


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=20000)
    args = ap.parse_args()
    lx = {}
    py = os.environ.get("LOADERX_PYTHON")
    if py:
        r = subprocess.run([py, "-c", LOADERX, str(args.draws)], capture_output=True, text=True)
        if r.returncode == 0:
            lx = json.loads(r.stdout.strip().splitlines()[-1])
        else:
            print("loaderx failed:", r.stderr[-500:])
    rng = np.random.default_rng(1)
    print("| batch | mode | zrecord us | NumPy us | x NumPy | loaderx us | x loaderx |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for b in SIZES:
        s = zrecord.Sampler(N, b, "iid", seed=1)
        z = per_draw(s.next, args.draws)
        npy = per_draw(lambda: rng.integers(0, N, b, dtype=np.uint64), args.draws)
        l = lx.get(f"iid/{b}")
        print(f"| {b} | iid | {z*1e6:.2f} | {npy*1e6:.2f} | {npy/z:.1f}x | {'' if l is None else f'{l*1e6:.2f}'} | {'' if l is None else f'{l/z:.2f}x'} |")
        c = zrecord.Sampler(N, b, "cyclic", seed=1)
        zc = per_draw(c.next, args.draws)
        t = time.perf_counter()
        perm = rng.permutation(N)
        cost_perm = (time.perf_counter() - t) * b / N
        k = [0]

        def take():
            i = k[0]
            k[0] = (i + b) % (N - b)
            return perm[i:i + b]

        npc = per_draw(take, args.draws) + cost_perm
        l = lx.get(f"cyclic/{b}")
        print(f"| {b} | cyclic | {zc*1e6:.2f} | {npc*1e6:.2f} | {npc/zc:.1f}x | {'' if l is None else f'{l*1e6:.2f}'} | {'' if l is None else f'{l/zc:.2f}x'} |")


if __name__ == "__main__":
    main()

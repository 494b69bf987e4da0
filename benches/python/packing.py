"""Sequence packing throughput and efficiency: zrecord.Packer vs Grain's FirstFitPackIterDataset
and a NumPy greedy first-fit reference (the same algorithm as zrecord's, documents held in
memory), on one ragged-token corpus, in one process. Reports real (non-padding) tokens per
second, the fraction of real tokens (packing efficiency), and the ratios to each peer.

    python benches/python/packing.py [--docs 20000] [--seq-len 2048] [--rows 8] [--seconds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import zrecord


def corpus(path, docs, seed=0):
    """Token documents with a long-tailed length distribution (median ~300, up to 8192)."""
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(5.7, 1.0, docs).astype(np.int64), 1, 8192)
    values = rng.integers(1, 50_000, int(lens.sum()), dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    shapes = lens.astype(np.uint64).reshape(-1, 1)
    with zrecord.RaggedWriter(path, np.int32, 1, "raw") as w:
        w.append(zrecord.RaggedBatch(values, cu, shapes))
    return [values[cu[i]:cu[i + 1]] for i in range(docs)]


def timed(step, seconds):
    """(real tokens / s, efficiency) of calling step() -> (real, total) for ~seconds."""
    step()
    real = total = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        r, t = step()
        real += r
        total += t
    return real / (time.perf_counter() - t0), real / total


def numpy_reference(docs, order, rows, seq_len, lookahead):
    state = {"window": [], "cursor": 0}

    def step():
        window = state["window"]
        while len(window) < lookahead:
            window.append([order[state["cursor"] % len(order)], 0])
            state["cursor"] += 1
        used = [0] * rows
        tokens = np.zeros((rows, seq_len), dtype=np.int32)
        positions = np.zeros((rows, seq_len), dtype=np.int64)
        doc_ids = np.full((rows, seq_len), -1, dtype=np.int64)
        for entry in window:
            d, off = entry
            total = len(docs[d])
            while off < total:
                rem = total - off
                if rem <= seq_len:
                    r = next((r for r in range(rows) if seq_len - used[r] >= rem), None)
                else:
                    r = next((r for r in range(rows) if used[r] == 0), None)
                if r is None:
                    break
                n = min(rem, seq_len)
                at = used[r]
                tokens[r, at:at + n] = docs[d][off:off + n]
                positions[r, at:at + n] = np.arange(off, off + n)
                doc_ids[r, at:at + n] = d
                used[r] += n
                off += n
            entry[1] = off
        state["window"] = [e for e in window if e[1] < len(docs[e[0]])]
        return sum(used), rows * seq_len

    return step


def grain_packer(docs, rows, seq_len):
    import grain
    import grain.experimental as ge

    def make():
        # Grain packs only documents truncated to the row length (it drops the rest; zrecord
        # and the reference cut long documents and keep every token).
        ds = grain.MapDataset.source([{"tokens": d[:seq_len]} for d in docs]).repeat(None).to_iter_dataset()
        return iter(ge.FirstFitPackIterDataset(ds, length_struct={"tokens": seq_len}, num_packing_bins=rows, shuffle_bins=False))

    it = make()

    def step():
        real = 0
        for _ in range(rows):
            ex = next(it)
            real += int((ex["tokens_segment_ids"] > 0).sum())
        return real, rows * seq_len

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--lookahead", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        docs = corpus(f"{tmp}/docs", args.docs)
        view = zrecord.RaggedStore(f"{tmp}/docs").bind(zrecord.Allocator())
        packer = zrecord.Packer(view, args.seq_len, rows=args.rows, lookahead=args.lookahead, seed=1)

        def zstep():
            b = next(packer)
            n = args.rows * args.seq_len
            return round(b["efficiency"] * n), n

        order = zrecord.Sampler(len(docs), 1, "cyclic", seed=1).epoch_order(0, 0, len(docs)).tolist()
        results = {"zrecord.Packer": timed(zstep, args.seconds)}
        results["NumPy first fit"] = timed(numpy_reference(docs, order, args.rows, args.seq_len, args.lookahead), args.seconds)
        try:
            results["Grain FirstFitPackIterDataset"] = timed(grain_packer(docs, args.rows, args.seq_len), args.seconds)
        except ImportError:
            print("grain not installed: its row is skipped")
    z = results["zrecord.Packer"][0]
    print(f"{args.docs} documents, [{args.rows}, {args.seq_len}] batches, lookahead {args.lookahead}")
    print("| packer | real tokens/s | efficiency | zrecord x |")
    print("|---|---:|---:|---:|")
    for name, (rate, eff) in results.items():
        print(f"| {name} | {rate / 1e6:.2f}M | {eff:.3f} | {z / rate:.1f}x |")


if __name__ == "__main__":
    main()

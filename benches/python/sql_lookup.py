"""Point lookups through SQL from Python, against a direct gather of the same ids, in one process.

Dense tokens (100,000 records of int32[512], 2 KiB each, raw codec), fresh IID batches of 256 ids;
every system returns the rows of those ids as Arrow (or, for the direct gather, a NumPy array of
the records):

- direct: `np.from_dlpack(view[ids])` (a bound `DenseStore`), the reference;
- `ctx.sql("... WHERE _id IN (<256 ids>)").to_arrow()`: SQL text, plan cache (ids in id order);
- `ctx.sql("... FROM gather('t', [<256 ids>])").to_arrow()`: SQL text, plan cache (ids in order);
- `ctx.prepare("... WHERE _id = ANY($1)").lookup(ids).to_arrow()`;
- `ctx.prepare("... FROM gather('t', $1)").lookup(ids).to_arrow()`;
- the `datafusion` PyPI package with `zrecord.Table` registered (datafusion-ffi), `_id IN` text:
  planned by that package every time (no plan cache there).

Each system runs in 8 interleaved rounds of about `--seconds / 8` s; the figure is the best
round's mean time per call. The wheel's build profile matters (the README's test command builds
a dev wheel whose DataFusion is unoptimised): the header prints which build ran.

    python benches/python/sql_lookup.py [--seconds 8] [--records 100000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import zrecord

B = 256


def best_round(fns, batches, seconds, rounds=8):
    """name -> best round's mean seconds per call (systems interleaved round by round)."""
    best = dict.fromkeys(fns, float("inf"))
    per = seconds / rounds / len(fns)
    k = 0
    for _ in range(rounds):
        for name, fn in fns.items():
            n, t0 = 0, time.perf_counter()
            while True:
                fn(batches[k % len(batches)])
                k += 1
                n += 1
                el = time.perf_counter() - t0
                if el >= per and n >= 5:
                    break
            best[name] = min(best[name], el / n)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--records", type=int, default=100_000)
    args = ap.parse_args()
    n = args.records
    root = tempfile.mkdtemp(prefix="zrecord-sql-lookup-")
    path = os.path.join(root, "tokens")
    data = np.random.default_rng(0).integers(0, 50_000, (n, 512), dtype=np.int32)
    with zrecord.DenseWriter(path, np.int32, (512,), "raw") as w:
        w.append(data)
    alloc = zrecord.Allocator("cpu")
    view = zrecord.DenseStore(path).bind(alloc)
    ctx = zrecord.SessionContext(target_partitions=2)
    ctx.register("t", path)
    col = ctx.sql("SELECT * FROM t LIMIT 1").columns[-1]
    sel = f'_id, "{col}"'
    by_any = ctx.prepare(f"SELECT {sel} FROM t WHERE _id = ANY($1)")
    by_gather = ctx.prepare(f"SELECT {sel} FROM gather('t', $1)")
    assert by_any.reuses_plan and by_gather.reuses_plan
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, n, B) for _ in range(2048)]
    texts_in = [f'SELECT {sel} FROM t WHERE _id IN ({", ".join(map(str, ids.tolist()))})' for ids in batches]
    texts_gather = [f"SELECT {sel} FROM gather('t', [{', '.join(map(str, ids.tolist()))}])" for ids in batches]
    k = {"in": 0, "gather": 0, "df": 0}

    def text(kind, texts, run):
        def f(_ids):
            i = k[kind] % len(texts)
            k[kind] += 1
            return run(texts[i])

        return f

    fns = {
        "direct view[ids]": lambda ids: np.from_dlpack(view[ids]),
        "sql text _id IN (plan cache)": text("in", texts_in, lambda s: ctx.sql(s).to_arrow()),
        "sql text gather() (plan cache)": text("gather", texts_gather, lambda s: ctx.sql(s).to_arrow()),
        "prepared _id = ANY($1)": lambda ids: by_any.lookup(ids).to_arrow(),
        "prepared gather('t', $1)": lambda ids: by_gather.lookup(ids).to_arrow(),
    }
    try:
        import datafusion

        dctx = datafusion.SessionContext()
        dctx.register_table("t", zrecord.Table(path))
        fns[f"datafusion {datafusion.__version__} + zrecord.Table, _id IN text"] = text("df", texts_in, lambda s: dctx.sql(s).to_arrow_table())
    except ImportError:
        print("(the datafusion package is not installed: its row is left out)")
    # Every system returns the right rows (id order for IN / ANY, given order for gathers).
    ids = batches[0]
    for name, fn in fns.items():
        out = fn(ids)
        if isinstance(out, np.ndarray):
            np.testing.assert_array_equal(out, data[ids], err_msg=name)
            continue
        got_ids = np.asarray(out.column("_id").to_pylist(), dtype=np.int64)
        got = np.stack(out.column(1).to_pylist()) if out.num_rows else np.empty((0, 512), np.int32)
        if "gather" in name:
            np.testing.assert_array_equal(got_ids, ids, err_msg=name)
        else:
            order = np.argsort(got_ids, kind="stable")
            got_ids, got = got_ids[order], got[order]
            np.testing.assert_array_equal(got_ids, np.unique(ids), err_msg=name)
        np.testing.assert_array_equal(got, data[got_ids], err_msg=name)
    k.update(dict.fromkeys(k, 0))
    t = best_round(fns, batches, args.seconds)
    direct = t["direct view[ids]"]
    print(f"\n## SQL point lookups from Python: {n} x int32[512] (raw), IID batches of {B}, zrecord from {os.path.dirname(zrecord.__file__)}\n")
    print("| system | us/call | vs direct gather |")
    print("|---|---:|---:|")
    for name, s in t.items():
        print(f"| {name} | {s * 1e6:.1f} | {s / direct:.2f}x |")


if __name__ == "__main__":
    main()

"""One rank of a distributed-store test (run as a separate process by test_dist.py).

    python dist_worker.py SCENARIO DIR RANK SIZE TRANSPORT [NAMESPACE]

Values encode their global id, so a misrouted row is caught: row g of "feat" is
``g * 1000 + arange(6)`` (float32), row g of "lab" is ``g`` (int64), record g of the ragged
store-backed "tok" is ``[g] * (g % 5 + 1)`` (int32). Rank r holds ``r + 3`` rows.
Prints one JSON line ``{"ok": ...}`` or ``{"error": type, "message": ...}`` at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

import zrecord
from zrecord.dist import DistDataset, DistStore

SCENARIO, DIR, RANK, SIZE, TRANSPORT = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
NS = sys.argv[6] if len(sys.argv) > 6 else "t"
COMM = None
if SCENARIO == "mpi":  # launched by mpiexec: rank and size come from the communicator
    from mpi4py import MPI

    COMM = MPI.COMM_WORLD
    RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
    NS = f"{NS}-mpi"


def rows_of(r: int) -> int:
    return r + 3


def first_of(r: int) -> int:
    return sum(rows_of(k) for k in range(r))


def total(size: int) -> int:
    return sum(rows_of(k) for k in range(size))


def feat(ids) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.float32)
    return ids[:, None] * 1000 + np.arange(6, dtype=np.float32)


def tok(g: int) -> list[int]:
    return [g] * (g % 5 + 1)


def ragged_store(rank: int) -> zrecord.RaggedStore:
    p = DIR / f"tok-{NS}-{rank}"
    if not p.exists():
        w = zrecord.RaggedWriter(str(p), "int32", 1, "zstd")
        w.append(zrecord.RaggedBatch.from_records([np.array(tok(g), dtype=np.int32) for g in range(first_of(rank), first_of(rank) + rows_of(rank))]))
        w.close()
    return zrecord.RaggedStore(str(p))


def setup(store: DistStore) -> None:
    lo, n = first_of(RANK), rows_of(RANK)
    store.add("feat", feat(range(lo, lo + n)))
    store.add("lab", np.arange(lo, lo + n, dtype=np.int64))
    store.add("tok", ragged_store(RANK))


def wait_for(name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not (DIR / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} never appeared")
        time.sleep(0.01)


def check_all(store: DistStore) -> dict:
    n = total(store.size)
    rng = np.random.default_rng(RANK)
    ids = rng.integers(0, n, size=257)
    ids[:3] = [n - 1, 0, n - 1]  # repeats and both ends
    out = np.empty((len(ids), 6), np.float32)
    store.get_batch("feat", out, ids)
    np.testing.assert_array_equal(out, feat(ids))
    lab = np.empty((len(ids), 1), np.int64)
    store.get_batch("lab", lab, ids)
    np.testing.assert_array_equal(lab[:, 0], ids)
    # get(): a range inside one shard (the last rank's), ValueError across shards.
    r = store.size - 1
    o = np.empty((2, 6), np.float32)
    store.get("feat", o, first_of(r) + 1)
    np.testing.assert_array_equal(o, feat([first_of(r) + 1, first_of(r) + 2]))
    errors = {}
    for what, fn in {
        "span": lambda: store.get("feat", np.empty((4, 6), np.float32), first_of(1) - 2),
        "oob": lambda: store.get_batch("feat", np.empty((1, 6), np.float32), [n]),
        "neg": lambda: store.get_batch("feat", np.empty((1, 6), np.float32), [-1]),
        "rows": lambda: store.get_batch("feat", np.empty((2, 6), np.float32), [0]),
        "width": lambda: store.get_batch("feat", np.empty((1, 5), np.float32), [0]),
        "dtype": lambda: store.get_batch("feat", np.empty((1, 6), np.float64), [0]),
        "name": lambda: store.get_batch("nope", np.empty((1, 6), np.float32), [0]),
    }.items():
        try:
            fn()
            errors[what] = None
        except Exception as e:  # noqa: BLE001
            errors[what] = type(e).__name__
    # Zero ids are valid on every transport, whatever the empty array's dtype.
    for empty in ([], np.empty(0), np.empty((0,), np.int64), np.empty(0, np.uint32)):
        z = np.empty((0, 6), np.float32)
        assert store.get_batch("feat", z, empty) is z
        assert store.get_batch("lab", np.empty((0, 1), np.int64), empty).shape == (0, 1)
        assert len(store.get_batch("tok", None, empty)) == 0
    store.get("feat", np.empty((0, 6), np.float32), first_of(store.size - 1))
    try:
        store.get_batch("feat", np.empty((0, 5), np.float32), [])
        errors["empty_width"] = None
    except Exception as e:  # noqa: BLE001
        errors["empty_width"] = type(e).__name__
    # Ragged store-backed shards come back packed.
    rb = store.get_batch("tok", None, ids[:50])
    recs = [np.from_dlpack(t).tolist() for t in rb.to_tensors()]
    assert recs == [tok(int(g)) for g in ids[:50]], recs[:5]
    # info / shard rows.
    assert store.info("feat") == (n, 6, 4), store.info("feat")
    assert store.info("lab") == (n, 1, 8)
    assert store.shard_rows("feat") == [rows_of(k) for k in range(store.size)]
    # A view for the Loader and SQL.
    v = store.view("lab")
    got = []
    with zrecord.Loader({"lab": [v]}, zrecord.Sampler(n, 4, "sequential"), workers=2) as loader:
        while len(got) < n:
            got.extend(np.from_dlpack(next(loader)[0]["lab"]).reshape(-1).tolist())
    assert got[:n] == list(range(n)), got
    ctx = zrecord.SessionContext()
    ctx.register_sources("d", {"lab": v, "feat": store.view("feat")})
    tbl = ctx.sql("SELECT count(*) AS c, sum(lab) AS s FROM d WHERE lab % 2 = 0").to_arrow()
    evens = [g for g in range(n) if g % 2 == 0]
    assert tbl.column("c")[0].as_py() == len(evens) and tbl.column("s")[0].as_py() == sum(evens), tbl
    # init + update + epoch visibility: rank r writes its rows as -(g + 1).
    store.init("w", rows_of(RANK), 2, 8, dtype=np.int64)
    lo = first_of(RANK)
    store.update("w", -(np.arange(lo, lo + rows_of(RANK), dtype=np.int64)[:, None] + 1).repeat(2, axis=1), 0)
    store.epoch_begin()
    wout = np.empty((n, 2), np.int64)
    store.get_batch("w", wout, np.arange(n))
    np.testing.assert_array_equal(wout[:, 0], -(np.arange(n) + 1))
    store.epoch_end()
    # Raw-byte variables read into any dtype of the same row size.
    store.init("raw", rows_of(RANK), 4, 2)
    assert store.info("raw") == (n, 4, 2)
    store.get_batch("raw", np.empty((1, 2), np.float32), [0])
    # Register / unregister reused destinations.
    pool = np.empty((8, 6), np.float32)
    store.register_recv("feat", pool)
    store.get_batch("feat", pool[:3], [0, 1, 2])
    store.unregister_recv("feat", pool)
    # torch-style batched dataset.
    ds = DistDataset(store, ["feat", "lab"])
    items = ds.__getitems__([n - 1, 2])
    np.testing.assert_array_equal(items["lab"], [n - 1, 2])
    prof = store.get_profile("feat")
    return {"errors": errors, "requests": prof["requests"], "calls": prof["calls"], "n": n, "mpi_windows": sorted(getattr(store, "_wins", None) or {})}


def main() -> None:
    result: dict = {}
    store = None
    try:
        if SCENARIO == "extra":
            store = DistStore(None, rendezvous=DIR, n_core=SIZE, namespace=NS, timeout=30)
            store.join("feat")
            ids = np.array([total(SIZE) - 1, 0, 3])
            out = np.empty((3, 6), np.float32)
            store.get_batch("feat", out, ids)
            np.testing.assert_array_equal(out, feat(ids))
            result = {"ok": True, "requests": store.get_profile("feat")["requests"]}
            print(json.dumps(result), flush=True)
            return
        timeout = float(os.environ.get("DIST_TIMEOUT", "20"))
        if COMM is not None:
            store = DistStore(COMM, transport=TRANSPORT, namespace=NS, timeout=timeout)
        else:
            store = DistStore(None, transport=TRANSPORT, rendezvous=DIR, rank=RANK, size=SIZE, namespace=NS, timeout=timeout, rejoin=SCENARIO == "rejoin")
        if SCENARIO == "rejoin":
            lo, n = first_of(RANK), rows_of(RANK)
            store.add("feat", feat(range(lo, lo + n)))
            (DIR / f"ready.{RANK}").write_text("1")
            wait_for("stop", 120)
            result = {"ok": True}
        elif SCENARIO in ("basic", "mpi"):
            setup(store)
            result = check_all(store)
            store.barrier()  # nobody leaves while others still read its shards
            result["ok"] = True
        elif SCENARIO == "serve":
            setup(store)
            (DIR / f"ready.{RANK}").write_text("1")
            wait_for("stop", 120)
            result = {"ok": True}
        elif SCENARIO == "read_after":
            # Wait for the parent to kill / stop / restart rank 1, then read its rows.
            setup(store)
            (DIR / f"ready.{RANK}").write_text("1")
            for phase in ("go", "go2"):
                wait_for(phase, 120)
                t0 = time.monotonic()
                try:
                    out = np.empty((2, 6), np.float32)
                    ids = [first_of(1), 0]
                    store.get_batch("feat", out, ids)
                    np.testing.assert_array_equal(out, feat(ids))
                    result[phase] = {"ok": True, "s": time.monotonic() - t0}
                except Exception as e:  # noqa: BLE001
                    result[phase] = {"error": type(e).__name__, "message": str(e), "s": time.monotonic() - t0}
                (DIR / f"done.{phase}").write_text(json.dumps(result[phase]))
        elif SCENARIO == "fork":
            setup(store)
            result = check_fork(store)
            store.barrier()
            result["ok"] = True
        else:
            raise ValueError(SCENARIO)
    except Exception as e:  # noqa: BLE001
        result = {"error": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}
    finally:
        line = json.dumps({"rank": RANK, **result})
        print(line, flush=True)
        (DIR / f"result.{NS}.{RANK}.json").write_text(line)
        if store is not None:
            store.free()


def read_pickled(view_pickle: bytes, dataset_pickle: bytes, ids):
    """In a spawned process: a pickled view and a pickled DistDataset reconnect by themselves."""
    import pickle

    view, ds = pickle.loads(view_pickle), pickle.loads(dataset_pickle)
    rows = np.from_dlpack(view.gather(np.asarray(ids, np.uint64))).copy()
    items = ds.__getitems__(ids)
    return rows, items["feat"], items["lab"]


def check_spawn(store: DistStore) -> None:
    import multiprocessing as mp
    import pickle

    n = total(store.size)
    ids = np.arange(n)[::-1].copy()
    ids[1] = ids[0]  # a repeat
    with mp.get_context("spawn").Pool(1) as pool:
        rows, f, lab = pool.apply(read_pickled, (pickle.dumps(store.view("feat")), pickle.dumps(DistDataset(store, ["feat", "lab"])), ids))
    np.testing.assert_array_equal(rows, feat(ids))
    np.testing.assert_array_equal(f, feat(ids))
    np.testing.assert_array_equal(lab, ids)


def check_fork(store: DistStore) -> dict:
    """fork_reader in forked workers: a torch DataLoader if torch is installed, else a bare fork;
    then pickled views / datasets in a spawned process."""
    check_spawn(store)
    n = total(store.size)
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        torch = None
    if torch is not None:
        ds = DistDataset(store, ["feat", "lab"])
        dl = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork", collate_fn=lambda b: b)
        seen = []
        for b in dl:
            np.testing.assert_array_equal(b["feat"], feat(b["lab"]))
            seen.extend(b["lab"].tolist())
        assert sorted(seen) == list(range(n)), seen
        return {"mode": "torch"}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: its own reader
        try:
            rd = store.fork_reader()
            out = np.empty((n, 6), np.float32)
            rd.get_batch("feat", out, np.arange(n)[::-1])
            ok = bool(np.array_equal(out, feat(np.arange(n)[::-1])))
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"1", got
    return {"mode": "fork"}


if __name__ == "__main__":
    main()

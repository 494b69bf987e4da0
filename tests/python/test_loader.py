import threading
import time

import numpy as np
import pytest

import zrecord
from zrecord import Loader, Sampler

N = 120


@pytest.fixture
def streams(tmp_path):
    x = np.stack([np.arange(N), 2 * np.arange(N)], axis=1).astype(np.int64)
    with zrecord.DenseWriter(tmp_path / "x", np.int64, (2,), "zstd") as w:
        w.append(x)
    recs = [np.full(i % 4 + 1, i, dtype=np.int32) for i in range(N)]
    with zrecord.RaggedWriter(tmp_path / "t", np.int32, 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(recs))
    xs, ts = zrecord.DenseStore(tmp_path / "x"), zrecord.RaggedStore(tmp_path / "t")
    allocs = [zrecord.Allocator() for _ in range(2)]
    return {"x": [xs.bind(a) for a in allocs], "tok": [ts.bind(a) for a in allocs]}


def ids_of(step_out):
    out = []
    for shard in step_out:
        x = np.from_dlpack(shard["x"])
        tok = shard["tok"]
        cu = np.from_dlpack(tok.cu_seqlens)
        vals = np.from_dlpack(tok.values)
        for k, i in enumerate(x[:, 0]):
            assert x[k, 1] == 2 * i
            np.testing.assert_array_equal(vals[cu[k]:cu[k + 1]], np.full(i % 4 + 1, i))
        out.extend(x[:, 0].tolist())
    return out


def test_sampler_modes_and_borrowed_buffer():
    s = Sampler(10, 4, Sampler.Mode.SEQUENTIAL, seed=0)
    a = s.next()
    assert a.dtype == np.uint64 and a.tolist() == [0, 1, 2, 3]
    b = s.next()
    assert b is a and a.tolist() == [4, 5, 6, 7]  # borrowed: reused by the next draw
    s.seek(0)
    assert s.next().tolist() == [0, 1, 2, 3]
    c = Sampler(1003, 10, "cyclic", seed=5)
    seen = np.concatenate([c.next().copy() for _ in range(100)])
    assert len(np.unique(seen)) == 1000  # one cycle: a true permutation of 1000 of the ids
    assert Sampler(1000, 8, Sampler.Mode.IID, seed=1).batch(3).tolist() == Sampler(1000, 8, "iid", seed=1).batch(3).tolist()
    assert Sampler(1000, 8, "iid", seed=1).batch(3).tolist() != Sampler(1000, 8, "iid", seed=2).batch(3).tolist()
    it = iter(Sampler(5, 2, "sequential"))
    assert next(it).tolist() == [0, 1]
    with pytest.raises(ValueError):
        Sampler(10, 11, "cyclic")
    with pytest.raises(ValueError):
        Sampler(0, 1, "iid")
    with pytest.raises(ValueError):
        Sampler(10, 1, "shuffled")


def test_iid_chi_square():
    s = Sampler(40, 1000, "iid", seed=9)
    counts = np.bincount(np.concatenate([s.next().copy() for _ in range(60)]).astype(np.int64), minlength=40)
    expected = 60_000 / 40
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 72.0  # 39 degrees of freedom, 99.9% quantile ~ 72.1


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_order_and_alignment(streams, workers):
    want = Sampler(N, 12, "cyclic", seed=3)
    with Loader(streams, Sampler(N, 12, "cyclic", seed=3), workers=workers, prefetch=2) as loader:
        for step in range(25):
            out = next(loader)
            assert len(out) == 2 and set(out[0]) == {"x", "tok"}
            assert ids_of(out) == want.batch(step).tolist()


def test_resume_equivalence(streams):
    def run(start_state, steps, workers):
        loader = Loader(streams, Sampler(N, 12, "iid", seed=11), workers=workers)
        if start_state is not None:
            loader.load_state_dict(start_state)
        got = [ids_of(next(loader)) for _ in range(steps)]
        state = loader.state_dict()
        loader.close()
        return got, state

    full, _ = run(None, 100, 3)
    first, state = run(None, 40, 2)
    assert state == {"step": 40}
    rest, _ = run(state, 60, 4)
    assert first + rest == full


def test_transform_and_its_exceptions(streams):
    calls = []

    def collate(shards):
        calls.append(threading.get_ident())
        return sum(len(np.from_dlpack(s["x"])) for s in shards)

    with Loader(streams, Sampler(N, 8, "iid"), workers=3, transform=collate) as loader:
        assert [next(loader) for _ in range(10)] == [8] * 10

    def boom(shards):
        raise RuntimeError("bad batch")

    with Loader(streams, Sampler(N, 8, "iid"), workers=2, transform=boom) as loader:
        with pytest.raises(RuntimeError, match="bad batch"):
            next(loader)


def test_cheap_transforms_run_on_the_consumer_expensive_ones_in_workers(streams):
    """Workers leave a cheap step's Python part (wrapping + transform) to the consumer once its
    average cost is known; an expensive transform stays on the workers. Results are the same
    steps in the same order either way."""
    main = threading.get_ident()
    sampler = Sampler(N, 8, "iid", seed=3)
    for delay, consumer in ((0.0, True), (0.003, False)):
        where = []

        def transform(shards, delay=delay, where=where):
            where.append(threading.get_ident())
            if delay:
                time.sleep(delay)
            return shards

        with Loader(streams, sampler, workers=2, transform=transform) as loader:
            got = [ids_of(next(loader)) for _ in range(60)]
        assert got == [sampler.batch(s).tolist() for s in range(60)]
        if consumer:
            # The first steps are measured on the workers; once the average is known, steps
            # run here (most of them: a loaded machine may slow a few past the threshold).
            assert where[:2] != [main, main] and where[-40:].count(main) >= 20, where
        else:
            assert main not in where, where


def test_close_while_workers_blocked(streams):
    loader = Loader(streams, Sampler(N, 8, "iid"), workers=4, prefetch=1)
    time.sleep(0.2)  # every worker now waits on the full window
    t0 = time.perf_counter()
    loader.close()
    assert time.perf_counter() - t0 < 5
    assert loader.closed
    with pytest.raises(StopIteration):
        next(loader)
    # Garbage collection of an open loader with a Python transform also stops it.
    loader2 = Loader(streams, Sampler(N, 8, "iid"), workers=2, transform=lambda s: len(s))
    next(loader2)
    del loader2


def test_custom_sampler_object(streams):
    class Fixed:
        def __init__(self):
            self.k = 0

        def next(self):
            self.k += 1
            return np.array([self.k, self.k + 1, 3, 4], dtype=np.int64)

    with Loader(streams, Fixed(), workers=2, prefetch=1) as loader:
        for step in range(5):
            assert ids_of(next(loader)) == [step + 1, step + 2, 3, 4]


def test_argument_errors(streams, tmp_path):
    x = streams["x"][0]
    with pytest.raises(ValueError, match="one view per position"):
        Loader({"x": streams["x"], "tok": streams["tok"][:1]}, Sampler(N, 8, "iid"))
    with pytest.raises(ValueError, match="no views"):
        Loader({"x": []}, Sampler(N, 8, "iid"))
    with pytest.raises(ValueError, match="divide evenly"):
        Loader(streams, Sampler(N, 7, "iid"))
    with pytest.raises(ValueError, match="prefetch"):
        Loader({"x": [x]}, Sampler(N, 8, "iid"), prefetch=0)
    with pytest.raises(TypeError):
        Loader({"x": [np.zeros(3)]}, Sampler(N, 8, "iid"))
    with zrecord.DenseWriter(tmp_path / "short", np.int64, (2,), "raw") as w:
        w.append(np.zeros((5, 2), np.int64))
    short = zrecord.DenseStore(tmp_path / "short").bind(zrecord.Allocator())
    with pytest.raises(ValueError, match="equal lengths"):
        Loader({"x": [x], "s": [short]}, Sampler(5, 5, "iid"))


def test_rank_slices(streams):
    s = Sampler(N, 12, "iid", seed=2)
    glob = s.batch(0).tolist()
    parts = []
    for rank in range(3):
        with Loader(streams, Sampler(N, 12, "iid", seed=2), workers=0, rank=rank, world_size=3) as loader:
            parts += ids_of(next(loader))
    assert parts == glob


def test_arrow_stream(streams):
    pa = pytest.importorskip("pyarrow")
    want = Sampler(N, 12, "cyclic", seed=4)
    src = zrecord.ArrowLoader(streams, Sampler(N, 12, "cyclic", seed=4), steps=3, workers=2)
    table = pa.table(src)
    assert table.column_names == ["_step", "_id", "x", "tok"]
    assert table.num_rows == 36
    assert table.column("_id").to_pylist() == np.concatenate([want.batch(s) for s in range(3)]).tolist()
    assert table.column("_step").to_pylist() == [s for s in range(3) for _ in range(12)]
    ids = np.array(table.column("_id").to_pylist())
    x = table.column("x").combine_chunks().to_numpy_ndarray()
    np.testing.assert_array_equal(x[:, 0], ids)
    assert table.column("tok").to_pylist()[0] == [int(ids[0])] * (int(ids[0]) % 4 + 1)
    with pytest.raises(ValueError, match="consumed"):
        pa.table(src)
    pl = pytest.importorskip("polars")
    df = pl.from_arrow(pa.table(zrecord.ArrowLoader(streams, Sampler(N, 12, "iid"), steps=2)))
    assert df.height == 24


@pytest.mark.parametrize("workers", [0, 2])
def test_strings_stay_strings_through_the_loader(tmp_path, workers):
    """utf8 and binary streams: the Loader's batches, view gathers and SourceViews all export
    as Arrow strings / binary (as views, to_arrow and SQL do) and give str / bytes records."""
    import pyarrow as pa

    texts = [f"é{i}" * (i % 5) for i in range(N)]  # empty strings included
    blobs = [bytes([i % 256]) * (i % 3 + 1) for i in range(N)]
    zrecord.write_dataset(pa.table({"k": np.arange(N), "s": texts, "b": pa.array(blobs, pa.binary())}), tmp_path / "root", allow_empty=True, progress=False)
    ds = zrecord.Dataset(tmp_path / "root")
    views = ds.bind(zrecord.Allocator())
    with Loader({name: [v] for name, v in views.items()}, Sampler(N, 16, "cyclic", seed=2), workers=workers) as loader:
        for _ in range(3):
            (batch,) = next(loader)
            ks = np.from_dlpack(batch["k"]).tolist()
            s, b = batch["s"], batch["b"]
            assert (s.logical, b.logical) == ("utf8", "binary")
            assert s.to_pylist() == [texts[k] for k in ks]
            assert b.to_pylist() == [blobs[k] for k in ks]
            arr = pa.array(s)
            assert arr.type == pa.string_view() and arr.to_pylist() == [texts[k] for k in ks]
            assert pa.array(b).type == pa.binary() and pa.array(b).to_pylist() == [blobs[k] for k in ks]
    ids = [7, 0, 7, N - 1]
    for got in (views["s"].gather(np.array(ids, np.uint64)), views["s"][ids]):
        assert got.logical == "utf8" and pa.array(got).to_pylist() == [texts[i] for i in ids]
        assert "logical=utf8" in repr(got)
    store = zrecord.open(tmp_path / "root" / "001-s")
    rv = store.bind(zrecord.Allocator())
    assert rv[ids].to_pylist() == [texts[i] for i in ids]
    assert pa.array(zrecord.SourceView(store)[ids]).type == pa.string_view()
    # Tensor batches: to_pylist gives one array per record; from fields, the logical type is
    # whatever the caller declares, checked against the values.
    t = zrecord.RaggedBatch.from_records([np.arange(3, dtype=np.int32), np.arange(1, dtype=np.int32)])
    assert t.logical == "tensor" and [x.tolist() for x in t.to_pylist()] == [[0, 1, 2], [0]]
    raw = np.frombuffer(b"abcde", np.uint8)
    fb = zrecord.RaggedBatch(raw, np.array([0, 2, 5], np.int32), np.array([[2], [3]], np.uint64), logical="utf8")
    assert fb.to_pylist() == ["ab", "cde"] and pa.array(fb).type == pa.string_view()
    with pytest.raises(ValueError, match="uint8"):
        zrecord.RaggedBatch(np.arange(3, dtype=np.int32), np.array([0, 3], np.int32), np.array([[3]], np.uint64), logical="utf8")
    bad = zrecord.RaggedBatch(np.frombuffer(b"\xff\xfe", np.uint8), np.array([0, 2], np.int32), np.array([[2]], np.uint64), logical="utf8")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        bad.to_pylist()

"""Hostile and careless input from Python: absurd sizes, foreign byte orders and strides,
buffers changed by another thread while the GIL is released, files cut under an open store,
loaders re-entered from their own transform. Typed errors or correct data; never a crash,
a hang or different values."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import zrecord as z


@pytest.fixture
def store(tmp_path):
    data = np.arange(64 * 4, dtype=np.int32).reshape(64, 4)
    p = tmp_path / "s"
    with z.DenseWriter(p, "int32", (4,), "raw") as w:
        w.append(data)
    return p, data


def run_child(code, timeout=120):
    """Run `code` in a fresh interpreter: a regression to a crash or a hang fails the test
    instead of taking the whole suite down."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"child failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.parametrize("mode", ["iid", "sequential", "cyclic"])
@pytest.mark.parametrize("batch", [2**24 + 1, 2**40, 2**62, 2**63 - 1])
def test_absurd_sampler_batch_sizes_are_value_errors(mode, batch):
    with pytest.raises(ValueError, match="batch_size"):
        z.Sampler(2**40, batch, mode)


def test_absurd_loader_sizes_are_value_errors(store):
    view = z.DenseStore(store[0]).bind(z.Allocator())
    s = z.Sampler(64, 4, "iid")
    with pytest.raises(ValueError, match="workers"):
        z.Loader({"x": [view]}, s, workers=2**40)
    with pytest.raises(ValueError, match="prefetch"):
        z.Loader({"x": [view]}, s, prefetch=2**40)
    with pytest.raises(ValueError, match="batch_size"):
        z.Loader({"x": [view]}, s, world_size=2**62)


def test_allocator_max_bytes_raises_memory_error_and_pickles(store):
    import pickle

    alloc = z.Allocator(pool_size_bytes=0, max_bytes=1024)
    assert alloc.max_bytes == 1024 and "max_bytes=1024" in repr(alloc)
    view = z.DenseStore(store[0]).bind(alloc)
    keep = view[0:10]
    with pytest.raises(MemoryError, match="max_bytes"):
        view.gather(np.arange(64))
    del keep
    assert np.array_equal(np.from_dlpack(view.gather(np.arange(64))), store[1])
    assert pickle.loads(pickle.dumps(alloc)).max_bytes == 1024
    assert z.Allocator().max_bytes is None


def test_huge_python_ints_are_index_errors(store):
    view = z.DenseStore(store[0]).bind(z.Allocator())
    for bad in [2**64, 2**200, -(2**200)]:
        with pytest.raises(IndexError):
            view[bad]
        with pytest.raises(IndexError):
            view.gather([0, bad])
        with pytest.raises(IndexError):
            view[(bad,)]
    with pytest.raises(TypeError):
        view.gather([0, 1.5])


def test_empty_numpy_batches(tmp_path, store):
    view = z.DenseStore(store[0]).bind(z.Allocator())
    assert np.from_dlpack(view.gather(np.array([], dtype=np.int64))).shape == (0, 4)
    # An empty array has zero strides: still contiguous, appends nothing.
    with z.DenseWriter(tmp_path / "e", "int32", (4,), "raw") as w:
        w.append(np.zeros((0, 4), np.int32))
        w.append(np.ones((2, 4), np.int32))
    assert len(z.DenseStore(tmp_path / "e")) == 2


@pytest.mark.parametrize("dtype", ["<i8", ">i8", ">u8", ">i4", "<u4", ">i2", "u1"])
def test_index_arrays_of_any_byte_order_and_stride(store, dtype):
    view = z.DenseStore(store[0]).bind(z.Allocator())
    want = np.array([5, 0, 63, 5, 17], dtype=dtype)
    for ids in [want, np.repeat(want, 3)[::3], want[::-1], np.asarray(want, order="C")[::1]]:
        got = np.from_dlpack(view.gather(ids))
        assert np.array_equal(got, store[1][ids.astype(np.int64)]), (dtype, ids.strides)
    # Strides that are not whole items (a packed record field): read item by item, not
    # truncated to a wrong element stride.
    rec = np.zeros(5, dtype=[("pad", "u1"), ("id", dtype)])
    rec["id"] = want
    ids = rec["id"]
    assert ids.strides[0] % ids.itemsize != 0 or ids.itemsize == 1
    assert np.array_equal(np.from_dlpack(view.gather(ids)), store[1][want.astype(np.int64)])
    bad = np.array([1, 64], dtype=dtype)
    with pytest.raises(IndexError, match="64"):
        view.gather(bad)


def test_foreign_byte_order_appends_are_refused_not_stored_wrong(tmp_path):
    with z.DenseWriter(tmp_path / "be", "int32", (4,), "raw") as w:
        with pytest.raises(TypeError, match="byte order"):
            w.append(np.arange(8, dtype=">i4").reshape(2, 4))
        w.append(np.arange(8, dtype=">i4").reshape(2, 4).astype("=i4"))
    got = np.from_dlpack(z.DenseStore(tmp_path / "be").bind(z.Allocator()).gather([1]))
    assert got.tolist() == [[4, 5, 6, 7]]
    with z.RaggedWriter(tmp_path / "r", "int32", 1, "raw") as w:
        b = z.RaggedBatch(np.arange(6, dtype=">i4"), np.array([0, 2, 6], np.int32), np.array([[2], [4]], np.uint64))
        with pytest.raises(TypeError, match="byte order"):
            w.append(b)
        # Packed record fields with strides that are not whole items are refused, not read
        # with a truncated stride.
        rec = np.zeros(6, dtype=[("pad", "u1"), ("v", "<i4")])
        rec["v"] = np.arange(6)
        with pytest.raises(ValueError, match="contiguous"):
            w.append(z.RaggedBatch(rec["v"], np.array([0, 2, 6], np.int32), np.array([[2], [4]], np.uint64)))


def test_ids_changed_by_another_thread_during_gathers(store):
    """The gather copies and checks the ids once: a thread scribbling out-of-range values into
    the array meanwhile yields IndexError or correct rows, nothing else."""
    view = z.DenseStore(store[0]).bind(z.Allocator())
    ids = np.arange(64, dtype=np.uint64)
    stop = threading.Event()

    def scribble():
        k = 0
        while not stop.is_set():
            ids[k % 64] = 2**63 + k if k % 2 else k % 64
            k += 1

    t = threading.Thread(target=scribble)
    t.start()
    ok = errors = 0
    try:
        for _ in range(3000):
            try:
                got = np.from_dlpack(view.gather(ids))
            except IndexError:
                errors += 1
                continue
            # Whatever ids were taken, each row equals the store's row of its first value.
            assert np.array_equal(got, store[1][got[:, 0] // 4])
            ok += 1
    finally:
        stop.set()
        t.join()
    assert ok + errors == 3000


def test_ragged_offsets_changed_by_another_thread_during_appends(tmp_path):
    """Offsets are validated on a private copy: a concurrent writer of the caller's
    cu_seqlens makes the append fail or store a consistent batch, never read out of bounds."""
    values = np.arange(1000, dtype=np.int32)
    cu = np.linspace(0, 1000, 101).astype(np.int32)
    shapes = np.diff(cu).astype(np.uint64).reshape(-1, 1)
    batch = z.RaggedBatch(values, cu, shapes)
    stop = threading.Event()

    def scribble():
        k = 0
        while not stop.is_set():
            cu[1 + k % 99] = 2**30 if k % 2 else (1 + k % 99) * 10
            k += 1

    t = threading.Thread(target=scribble)
    t.start()
    written = 0
    try:
        with z.RaggedWriter(tmp_path / "r", "int32", 1, "raw") as w:
            for _ in range(300):
                try:
                    w.append(batch)
                    written += 1
                except ValueError:
                    pass
    finally:
        stop.set()
        t.join()
    s = z.RaggedStore(tmp_path / "r")
    assert len(s) == 100 * written
    assert s.verify() == len(s)


def _transform_script(workers, action):
    return f"""
        import numpy as np, zrecord as z, tempfile, os, time
        d = tempfile.mkdtemp()
        with z.DenseWriter(d + "/s", "int64", (1,), "raw") as w:
            w.append(np.arange(64, dtype=np.int64).reshape(64, 1))
        view = z.DenseStore(d + "/s").bind(z.Allocator())
        seen = []
        holder = {{}}
        def transform(parts):
            # Workers start as soon as the loader exists, before holder is filled: wait.
            while "l" not in holder:
                time.sleep(0.001)
            l = holder["l"]
            seen.append(l.state_dict()["step"])
            if {action!r} == "close" and len(seen) == 3:
                l.close()
            if {action!r} == "load":
                try:
                    l.load_state_dict({{"step": 0}})
                except RuntimeError as e:
                    seen.append(str(e))
            return parts
        l = z.Loader({{"x": [view]}}, z.Sampler(64, 4, "sequential"), workers={workers}, transform=transform)
        holder["l"] = l
        got = []
        for i, b in enumerate(l):
            got.append(i)
            if i == 5:
                break
        if {action!r} == "close":
            # In order, nothing after the closing step (with workers, steps made before the
            # close but not yet delivered go with it).
            assert l.closed and got == list(range(len(got))) and len(got) <= 3, got
            if {workers} == 0:
                assert got == [0, 1, 2], got
        else:
            assert any("own transform" in str(s) for s in seen), seen
        l.close()
        print("ok", got)
    """


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("action", ["close", "load"])
def test_transform_reentering_its_loader_does_not_deadlock(workers, action):
    assert "ok" in run_child(_transform_script(workers, action), timeout=60)


def test_data_file_truncated_under_an_open_store(tmp_path):
    out = run_child(f"""
        import numpy as np, zrecord as z, os
        for checked in (True, False):
            p = {str(tmp_path)!r} + f"/s-{{checked}}"
            with z.DenseWriter(p, "uint8", (8192,), "raw", data_shards=1) as w:
                w.append(np.full((64, 8192), 7, np.uint8))
            view = z.DenseStore(p).bind(z.Allocator(), verify_checksums=checked)
            assert np.from_dlpack(view.gather([63])).min() == 7
            os.truncate(os.path.join(p, "data-000.bin"), 8192)
            try:
                view.gather([40, 50])
            except z.CorruptStoreError as e:
                assert "truncated" in str(e) or "checksum" in str(e), e
            else:
                raise AssertionError("no error")
            try:
                z.DenseStore(p).verify()
            except z.CorruptStoreError:
                pass
            else:
                raise AssertionError("a truncated store opened")
        print("survived")
    """)
    assert "survived" in out


def test_sql_gather_ids_past_2_63_are_out_of_range(store):
    ctx = z.SessionContext()
    with pytest.raises(IndexError, match="out of range"):
        ctx.sql(f"SELECT * FROM gather('{store[0]}', [9223372036854775808])").to_arrow()
    with pytest.raises(ValueError, match="batch_size"):
        ctx.sql(f"SELECT * FROM loader('{store[0]}', 4611686018427387904, 'iid', 0, 1)").to_arrow()


def test_symlinked_stream_leaving_the_root(tmp_path):
    data = np.arange(8, dtype=np.int32).reshape(2, 4)
    with z.DenseWriter(tmp_path / "outside", "int32", (4,), "raw") as w:
        w.append(data)
    root = tmp_path / "root"
    root.mkdir()
    with z.DenseWriter(root / "a", "int32", (4,), "raw") as w:
        w.append(data)
    os.symlink(tmp_path / "outside", root / "b")
    with pytest.raises(z.CorruptStoreError, match="outside the dataset root"):
        z.Dataset(root)


def test_copy_dictionary_option_naming_a_fifo_does_not_hang(tmp_path, store):
    fifo = tmp_path / "dict"
    os.mkfifo(fifo)
    ctx = z.SessionContext()
    with pytest.raises(ValueError, match="not a regular file"):
        ctx.sql(f"COPY (SELECT s FROM '{store[0]}') TO '{tmp_path / 'out'}' STORED AS ZRECORD OPTIONS (codec 'zstd_dict', dictionary '{fifo}')")
    assert not (tmp_path / "out").exists()


def test_loader_in_a_cycle_through_its_transform_is_collected():
    """A transform that refers back to its loader makes a reference cycle through Rust: the
    garbage collector sees it (Loader.__traverse__) and breaks it (__clear__ closes the loader
    and joins its workers), so no worker threads leak."""
    out = run_child(
        """
        import gc, time, tempfile
        import numpy as np, zrecord as z

        def threads():
            with open("/proc/self/status") as f:
                return int(next(l for l in f if l.startswith("Threads:")).split()[1])

        d = tempfile.mkdtemp()
        with z.DenseWriter(d + "/s", "int64", (1,), "raw") as w:
            w.append(np.arange(64, dtype=np.int64).reshape(64, 1))
        view = z.DenseStore(d + "/s").bind(z.Allocator())
        warm = z.Loader({"x": [view]}, z.Sampler(64, 4, "iid", seed=1), workers=2, prefetch=2)
        next(iter(warm))
        warm.close()
        del warm
        base = threads()
        for k in range(3):
            holder = {}

            def transform(parts, holder=holder):
                # Workers start as soon as the loader exists, before holder is filled.
                if "loader" in holder:
                    holder["loader"].state_dict()
                return parts

            l = z.Loader({"x": [view]}, z.Sampler(64, 4, "iid", seed=k), workers=2, prefetch=2, transform=transform)
            holder["loader"] = l
            next(iter(l))
            del l, transform, holder
        # A worker may be inside the transform (holding the cycle) at the moment of one
        # collection: collect again until the cycle is unreachable and its workers are joined.
        deadline = time.monotonic() + 20
        while threads() > base and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        assert threads() <= base, (threads(), base)
        print("ok")
        """,
        timeout=120,
    )
    assert "ok" in out

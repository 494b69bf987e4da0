"""Handles pickle as (path, options, state) and reopen in another process: stores, views,
source views, dataset roots, allocators and the sampler. Checked against the bytes NumPy wrote,
in child processes started with spawn and with fork."""

import multiprocessing as mp
import pickle

import numpy as np
import pyarrow as pa
import pytest

import zrecord


@pytest.fixture()
def stores(tmp_path):
    dense = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    with zrecord.DenseWriter(tmp_path / "d.zrec", "float32", (3,), "zstd") as w:
        w.append(dense)
    ragged = [np.arange(i + 1, dtype=np.int32) * 7 for i in range(40)]
    with zrecord.RaggedWriter(tmp_path / "r.zrec", "int32", 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(ragged))
    zrecord.write_dataset(pa.table({"x": np.arange(40, dtype=np.int64) * 3, "s": [f"row {i}" for i in range(40)]}), tmp_path / "root")
    return tmp_path, dense, ragged


def _child_read(obj_bytes, ids):
    """Runs in the child: unpickle, gather, return plain NumPy / Python values."""
    obj = pickle.loads(obj_bytes)
    out = {}
    for name, v in obj.items():
        b = v.gather(ids)
        if isinstance(b, zrecord.RaggedBatch):
            vals, cu = np.from_dlpack(b.values), np.from_dlpack(b.cu_seqlens)
            out[name] = [vals[cu[i]:cu[i + 1]].copy() for i in range(len(ids))]
        else:
            out[name] = np.from_dlpack(b).copy()
    return out


def test_store_view_sampler_roundtrip_in_process(stores):
    root, dense, ragged = stores
    s = zrecord.open(root / "d.zrec")
    v = s.bind(zrecord.Allocator(pool_size_bytes=1 << 20), verify_checksums=False)
    s2 = pickle.loads(pickle.dumps(s))
    assert isinstance(s2, zrecord.DenseStore) and len(s2) == 40 and s2.path == s.path
    v2 = pickle.loads(pickle.dumps(v))
    assert isinstance(v2, zrecord.DenseView)
    assert v2.verify_checksums is False and v2.allocator.pool_size_bytes == 1 << 20
    np.testing.assert_array_equal(np.from_dlpack(v2.gather([5, 0, 39])), dense[[5, 0, 39]])

    smp = zrecord.Sampler(40, 8, "cyclic", seed=3)
    first = [next(smp).copy() for _ in range(3)]
    smp2 = pickle.loads(pickle.dumps(smp))
    assert (smp2.step, smp2.mode, smp2.seed, smp2.batch_size, len(smp2)) == (3, "cyclic", 3, 8, 40)
    np.testing.assert_array_equal(next(smp2), smp.batch(3))
    np.testing.assert_array_equal(smp2.batch(1), first[1])


def test_closed_handles_refuse_to_pickle(stores):
    root, _, _ = stores
    s = zrecord.open(root / "d.zrec")
    v = s.bind(zrecord.Allocator())
    s.close()
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(s)
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(v)
    with pytest.raises(TypeError):
        pickle.dumps(zrecord.Loader({"a": [zrecord.open(root / "r.zrec").bind(zrecord.Allocator())]}, zrecord.Sampler(40, 4, "sequential"), workers=0))


def test_views_of_one_pool_share_a_pool_after_unpickling(stores):
    root, _, _ = stores
    a = zrecord.Allocator(pool_size_bytes=1 << 22)
    d = zrecord.open(root / "d.zrec").bind(a)
    r = zrecord.open(root / "r.zrec").bind(a)
    d2, r2 = pickle.loads(pickle.dumps((d, r)))
    d2.gather([1, 2])  # released at once: the batch returns to the pool
    before = r2.allocator.stats()
    assert before["idle_bytes"] > 0, "the two views were given different pools"


def test_dataset_root_pickles(stores):
    root, _, _ = stores
    ds = zrecord.Dataset(root / "root")
    assert len(ds) == 40 and ds.streams == ["x", "s"] and "x" in ds and "nope" not in ds
    with pytest.raises(KeyError, match="nope"):
        ds.view("nope")
    ds2 = pickle.loads(pickle.dumps(ds))
    assert ds2.path == ds.path and ds2.streams == ds.streams
    views = pickle.loads(pickle.dumps(ds.bind(verify_checksums=False)))
    assert set(views) == {"x", "s"} and views["s"].logical == "utf8" and not views["x"].verify_checksums
    np.testing.assert_array_equal(np.from_dlpack(views["x"].gather([3, 1])), [9, 3])


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_handles_reopen_in_child_processes(stores, method):
    root, dense, ragged = stores
    a = zrecord.Allocator()
    ds = zrecord.Dataset(root / "root").bind(a)
    obj = {
        "dense": zrecord.open(root / "d.zrec").bind(a),
        "ragged": zrecord.open(root / "r.zrec").bind(a),
        "source": zrecord.SourceView(zrecord.open(root / "d.zrec"), a),
        "x": ds["x"],
    }
    ids = [39, 0, 7, 7]
    ctx = mp.get_context(method)
    with ctx.Pool(2) as pool:
        results = pool.starmap(_child_read, [(pickle.dumps(obj), ids)] * 2)
    for got in results:
        np.testing.assert_array_equal(got["dense"], dense[ids])
        np.testing.assert_array_equal(got["source"], dense[ids])
        np.testing.assert_array_equal(got["x"], np.array(ids) * 3)
        for g, i in zip(got["ragged"], ids):
            np.testing.assert_array_equal(g, ragged[i])


def test_sampler_buffer_cannot_be_resized_under_the_sampler():
    smp = zrecord.Sampler(100, 16, "iid", seed=1)
    buf = next(smp)
    with pytest.raises((ValueError, BufferError)):
        buf.resize(1 << 20, refcheck=False)
    with pytest.raises((ValueError, BufferError)):
        buf.base[:] = b""  # the bytearray behind it is exported: it cannot change size
    np.testing.assert_array_equal(next(smp), smp.batch(1))


def test_epoch_order(stores):
    s = zrecord.Sampler(103, 10, "cyclic", seed=9)
    for epoch in range(2):
        order = s.epoch_order(epoch, 0, 103)
        assert sorted(order.tolist()) == list(range(103))
        for j in range(10):
            np.testing.assert_array_equal(s.batch(epoch * 10 + j), order[j * 10:(j + 1) * 10])
    np.testing.assert_array_equal(zrecord.Sampler(7, 2, "sequential").epoch_order(3, 2, 7), [2, 3, 4, 5, 6])
    with pytest.raises(IndexError):
        s.epoch_order(0, 100, 104)
    with pytest.raises(ValueError, match="iid"):
        zrecord.Sampler(10, 2, "iid").epoch_order(0, 0, 2)


def test_dataset_streams_unpickle_with_one_open_and_see_a_republished_root(stores, tmp_path):
    import shutil

    from zrecord import _pickle

    root, _, _ = stores
    views = zrecord.Dataset(root / "root").bind()
    blob = pickle.dumps(views)
    _pickle._datasets.clear()
    pickle.loads(blob)
    assert len(_pickle._datasets) == 1  # both streams came from one opened root
    # The root replaced by a new one at the same path: unpickling opens the new one.
    shutil.rmtree(root / "root")
    zrecord.write_dataset(pa.table({"x": np.arange(40, dtype=np.int64) * 5, "s": ["z"] * 40}), root / "root")
    again = pickle.loads(blob)
    np.testing.assert_array_equal(np.from_dlpack(again["x"].gather([2])), [10])

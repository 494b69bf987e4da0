import pickle

import numpy as np
import pytest

import zrecord
from conftest import CODECS, HAVE_ML_DTYPES, ML_DTYPES, NUMPY_DTYPES, random_array, writer_kwargs


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_round_trip_numpy_dtypes(tmp_path, alloc, dtype, codec):
    data = random_array(dtype, (37, 3, 4), seed=len(dtype))
    path = tmp_path / "s"
    with zrecord.DenseWriter(path, data.dtype, data.shape[1:], data_shards=3, **writer_kwargs(codec, data)) as w:
        w.append(data[:10])
        w.append(data[10:])
        assert len(w) == 37
    with zrecord.DenseStore(path) as store:
        assert len(store) == 37
        assert store.codec == codec
        assert store.item_shape == (3, 4)
        assert store.dtype == data.dtype
        view = store.bind(alloc)
        assert len(view) == 37
        np.testing.assert_array_equal(np.from_dlpack(view[5]), data[5])
        ids = [36, 0, 5, 5, 17]
        np.testing.assert_array_equal(np.from_dlpack(view[ids]), data[ids])
        np.testing.assert_array_equal(np.from_dlpack(view[36, 0, 5]), data[[36, 0, 5]])
        np.testing.assert_array_equal(np.from_dlpack(view[np.array(ids)]), data[ids])
        np.testing.assert_array_equal(np.from_dlpack(view[np.array(ids, dtype=np.uint64)]), data[ids])
        np.testing.assert_array_equal(np.from_dlpack(view[np.array(ids, dtype=np.int32)]), data[ids])
        for sl in [slice(None), slice(3, 9), slice(None, None, 3), slice(30, 2, -4), slice(-5, None), slice(5, 5)]:
            np.testing.assert_array_equal(np.from_dlpack(view[sl]), data[sl])
        records = list(view)
        assert len(records) == 37
        np.testing.assert_array_equal(np.from_dlpack(records[12]), data[12])
        assert store.verify() == 37


@pytest.mark.skipif(not HAVE_ML_DTYPES, reason="ml_dtypes not installed")
@pytest.mark.parametrize("dtype", ML_DTYPES)
def test_round_trip_ml_dtypes(tmp_path, alloc, dtype):
    pa = pytest.importorskip("pyarrow")
    data = random_array(dtype, (20, 6), seed=3)
    path = tmp_path / "s"
    with zrecord.DenseWriter(path, dtype, (6,), "zstd") as w:
        w.append(data)
    view = zrecord.DenseStore(path).bind(alloc)
    assert view.dtype == data.dtype
    t = view[[4, 1]]
    arr = pa.array(t)
    flat = arr.storage.flatten() if hasattr(arr, "storage") else arr.flatten()
    got = np.frombuffer(flat.buffers()[1], dtype=np.uint16 if data.itemsize == 2 else np.uint8)[: 12]
    np.testing.assert_array_equal(got, data[[4, 1]].reshape(-1).view(got.dtype))


def test_zero_copy_and_lifetime(tmp_path):
    data = np.arange(1000 * 8, dtype=np.float32).reshape(1000, 8)
    path = tmp_path / "s"
    with zrecord.DenseWriter(path, np.float32, (8,), "raw") as w:
        w.append(data)
    store = zrecord.DenseStore(path)
    allocator = zrecord.Allocator("cpu")
    view = store.bind(allocator)
    t = view[[7, 3, 9]]
    a = np.from_dlpack(t)
    # The array aliases the batch's allocation: no copy happened.
    assert a.__array_interface__["data"][0] == t.data_ptr
    assert a.ctypes.data % 64 == 0
    b = np.from_dlpack(t)
    assert b.__array_interface__["data"][0] == t.data_ptr
    # The array outlives the tensor, view, store and allocator.
    del t, view
    store.close()
    allocator.close()
    del store, allocator
    import gc

    gc.collect()
    np.testing.assert_array_equal(a, data[[7, 3, 9]])
    np.testing.assert_array_equal(b, a)


def test_record_and_batch_shapes(tmp_path, alloc):
    data = np.arange(5 * 2 * 3, dtype=np.int16).reshape(5, 2, 3)
    with zrecord.DenseWriter(tmp_path / "s", "int16", (2, 3), "zstd") as w:
        w.append(data)
    view = zrecord.open(tmp_path / "s").bind(alloc)
    assert isinstance(view, zrecord.DenseView)
    assert view[0].shape == (2, 3)
    assert view[[0]].shape == (1, 2, 3)
    assert view[0, 1].shape == (2, 2, 3)
    assert view[[]].shape == (0, 2, 3)
    assert view[0].dtype == np.int16
    assert view.item_shape == (2, 3) and view.ndim == 2 and view.codec == "zstd"
    assert view[3].__dlpack_device__() == (1, 0)
    # Legacy (unversioned) DLPack export works too.
    cap = view[2].__dlpack__()
    assert "dltensor" in repr(cap)
    vcap = view[2].__dlpack__(max_version=(1, 1))
    assert "dltensor_versioned" in repr(vcap)


def test_scalar_records(tmp_path, alloc):
    labels = np.array([3, 1, 4, 1, 5], dtype=np.int64)
    with zrecord.DenseWriter(tmp_path / "l", labels.dtype, (), "raw") as w:
        w.append(labels)
    v = zrecord.DenseStore(tmp_path / "l").bind(alloc)
    assert np.from_dlpack(v[2]).shape == ()
    assert int(np.from_dlpack(v[2])) == 4
    np.testing.assert_array_equal(np.from_dlpack(v[::2]), labels[::2])


def test_readonly_memmap_append_without_copy(tmp_path, alloc):
    src = tmp_path / "x.npy"
    data = np.random.default_rng(1).integers(0, 255, size=(64, 32), dtype=np.uint8)
    np.save(src, data)
    mm = np.load(src, mmap_mode="r")
    assert not mm.flags.writeable
    with zrecord.DenseWriter(tmp_path / "s", mm.dtype, mm.shape[1:], "zstd") as w:
        w.append(mm)
    np.testing.assert_array_equal(np.from_dlpack(zrecord.DenseStore(tmp_path / "s").bind(alloc)[:]), data)


def test_transcode_raw_to_zstd_dict(tmp_path, alloc):
    rng = np.random.default_rng(5)
    data = rng.zipf(1.3, size=(400, 64)).astype(np.int32)
    with zrecord.DenseWriter(tmp_path / "src", data.dtype, data.shape[1:], "raw") as w:
        w.append(data)
    with zrecord.DenseStore(tmp_path / "src") as source_store:
        source = source_store.bind(alloc)
        dictionary = zrecord.train_dict(source)
        assert isinstance(dictionary, bytes) and len(dictionary) > 0
        with zrecord.DenseWriter(tmp_path / "dst", dtype=source.dtype, item_shape=source.item_shape,
                                 codec="zstd_dict", dict_bytes=dictionary) as dst:
            dst.append(source[:])
    out = zrecord.DenseStore(tmp_path / "dst")
    assert out.codec == "zstd_dict"
    assert out.dictionary == dictionary
    assert out.stats()["stored_bytes"] < out.stats()["raw_bytes"]
    np.testing.assert_array_equal(np.from_dlpack(out.bind(alloc)[:]), data)


def test_allocator_pool_reuse(tmp_path):
    data = np.ones((100, 1000), dtype=np.float32)
    with zrecord.DenseWriter(tmp_path / "s", "float32", (1000,), "raw") as w:
        w.append(data)
    with zrecord.Allocator("cpu", pool_size_bytes=32 << 20) as a:
        view = zrecord.DenseStore(tmp_path / "s").bind(a)
        for _ in range(10):
            view[list(range(50))]
        st = a.stats()
        assert st["fresh"] == 1 and st["reused"] == 9 and st["live_bytes"] == 0
        assert a.pool_size_bytes == 32 << 20 and a.device == "cpu"
        assert repr(a) == f"Allocator('cpu', pool_size_bytes={32 << 20})"


def test_allocator_old_pool_size_keyword_warns_and_still_works():
    with pytest.warns(DeprecationWarning, match="pool_size_bytes"):
        a = zrecord.Allocator("cpu", pool_size=1 << 20)
    assert a.pool_size_bytes == 1 << 20
    with pytest.warns(DeprecationWarning, match="pool_size_bytes"):
        assert a.pool_size == 1 << 20
    assert zrecord.Allocator("cpu", 2 << 20).pool_size_bytes == 2 << 20  # positional unchanged
    with pytest.raises(TypeError, match="both"):
        zrecord.Allocator("cpu", pool_size_bytes=1, pool_size=1)


def test_unchecked_view_reads_same_data(tmp_path, alloc):
    data = np.arange(300, dtype=np.int32).reshape(100, 3)
    with zrecord.DenseWriter(tmp_path / "s", np.int32, (3,), "raw") as w:
        w.append(data)
    store = zrecord.DenseStore(tmp_path / "s")
    fast = store.bind(alloc, verify_checksums=False)
    np.testing.assert_array_equal(np.from_dlpack(fast[[5, 99, 0]]), data[[5, 99, 0]])
    # Damage a record's bytes: the checked view raises, the unchecked one reads what is there.
    shard = next(p for p in sorted((tmp_path / "s").iterdir()) if p.name.startswith("data-") and p.stat().st_size > 64)
    raw = bytearray(shard.read_bytes())
    raw[64] ^= 0x01
    shard.write_bytes(bytes(raw))
    store = zrecord.DenseStore(tmp_path / "s")
    with pytest.raises(zrecord.CorruptStoreError):
        store.bind(alloc)[:]
    assert np.from_dlpack(store.bind(alloc, verify_checksums=False)[:]).shape == (100, 3)


def test_numpy_integer_scalars_index_one_record(tmp_path, alloc):
    data = np.arange(20, dtype=np.int64).reshape(10, 2)
    with zrecord.DenseWriter(tmp_path / "s", np.int64, (2,), "raw") as w:
        w.append(data)
    view = zrecord.DenseStore(tmp_path / "s").bind(alloc)
    np.testing.assert_array_equal(np.from_dlpack(view[np.int64(7)]), data[7])
    np.testing.assert_array_equal(np.from_dlpack(view[np.array(3)]), data[3])
    with pytest.raises(IndexError):
        view[np.uint8(10)]


@pytest.mark.parametrize("codec", CODECS)
def test_released_and_evicted_pages_read_back_the_same(tmp_path, alloc, codec):
    data = random_array("uint16", (500, 1024), seed=3)
    path = tmp_path / "s"
    with zrecord.DenseWriter(path, data.dtype, data.shape[1:], data_shards=2, **writer_kwargs(codec, data)) as w:
        w.append(data)
    store = zrecord.DenseStore(path)
    view = store.bind(alloc)
    ids = np.array([499, 0, 7, 7, 250])
    np.testing.assert_array_equal(np.from_dlpack(view[ids]), data[ids])
    assert store.cold is False
    store.release_pages()
    np.testing.assert_array_equal(np.from_dlpack(view[ids]), data[ids])
    store.release_pages(evict=True)
    np.testing.assert_array_equal(np.from_dlpack(view[ids[::-1]]), data[ids[::-1]])
    # A residency bound: reads stay exact while the mapped pages are released under them.
    store.set_max_mapped_bytes(64 << 10)
    for k in range(20):
        b = np.random.default_rng(k).integers(0, 500, 64)
        np.testing.assert_array_equal(np.from_dlpack(view[b]), data[b])
    store.set_max_mapped_bytes(None)
    with pytest.raises(TypeError):
        store.set_max_mapped_bytes("lots")
    store.close()
    with pytest.raises(ValueError):
        store.release_pages()


def test_views_and_source_views_export_tables_natively(tmp_path):
    """to_arrow and logical are methods of the extension's view classes (no Python patching),
    with one behaviour for DenseView, RaggedView and SourceView."""
    pa = pytest.importorskip("pyarrow")
    data = np.arange(24, dtype=np.int16).reshape(4, 2, 3)
    with zrecord.DenseWriter(tmp_path / "d", np.int16, (2, 3), "raw") as w:
        w.append(data)
    recs = [np.arange(n, dtype=np.int32) for n in (2, 0, 3)]
    with zrecord.RaggedWriter(tmp_path / "r", np.int32, 1, "zstd", allow_empty=True) as w:
        w.append(zrecord.RaggedBatch.from_records(recs))
    alloc = zrecord.Allocator()
    dense, ragged = zrecord.DenseStore(tmp_path / "d").bind(alloc), zrecord.RaggedStore(tmp_path / "r").bind(alloc)
    # One implementation: a store's views are SourceViews and inherit every read method.
    assert type(zrecord.SourceView.__dict__["to_arrow"]).__name__ == "method_descriptor"
    for cls in (zrecord.DenseView, zrecord.RaggedView):
        assert issubclass(cls, zrecord.SourceView) and isinstance(dense if cls is zrecord.DenseView else ragged, zrecord.SourceView)
        assert not {"to_arrow", "to_arrow_batch", "gather", "__getitem__", "logical", "__len__"} & set(cls.__dict__), cls
    t = dense.to_arrow([3, 0])
    assert isinstance(t, pa.Table) and t.column_names == ["d"] and dense.name == "d"
    np.testing.assert_array_equal(t.column("d").combine_chunks().to_numpy_ndarray(), data[[3, 0]])
    assert ragged.to_arrow().column("r").to_pylist() == [r.tolist() for r in recs]
    sv = zrecord.SourceView(ragged)
    assert sv.name == "r" and sv.to_arrow([2]).column("r").to_pylist() == [[0, 1, 2]]
    assert dense.logical == ragged.logical == sv.logical == "tensor"
    assert [np.from_dlpack(x).tolist() for x in dense] == data.tolist()
    assert repr(dense) == "DenseView('d', 4 records, int16 dense [2, 3], raw)"
    assert repr(ragged) == "RaggedView('r', 3 records, int32 ragged ndim 1, zstd)"


def test_a_stream_has_one_name_in_views_tables_and_sql(tmp_path):
    """`root/000-t` is `t` whether the root or the stream folder alone is opened: the view's
    name, its to_arrow column and its SQL column."""
    pa = pytest.importorskip("pyarrow")
    tokens = [np.arange(n, dtype=np.int32) for n in (3, 1, 2)]
    zrecord.write_dataset(pa.table({"t": pa.array([r.tolist() for r in tokens], pa.list_(pa.int32()))}), tmp_path / "root", codec="raw")
    alloc = zrecord.Allocator()
    folder = next((tmp_path / "root").glob("*-t"))
    views = [zrecord.Dataset(tmp_path / "root").view("t", alloc), zrecord.open(folder).bind(alloc)]
    views.append(zrecord.SourceView(views[1]))
    views.append(zrecord.SourceView(zrecord.open(folder), alloc))
    for v in views:
        assert v.name == "t", v
        assert v.to_arrow().column_names == ["t"], v
        assert v.to_arrow([2, 0]).column("t").to_pylist() == [[0, 1], [0, 1, 2]]
    ctx = zrecord.SessionContext()
    ctx.register("lone", folder)
    assert ctx.sql("SELECT t FROM lone ORDER BY _id").to_arrow().column("t").to_pylist() == [r.tolist() for r in tokens]


def test_a_closed_stores_views_refuse_every_read(tmp_path):
    with zrecord.DenseWriter(tmp_path / "d", np.int16, (2,), "raw") as w:
        w.append(np.arange(8, dtype=np.int16).reshape(4, 2))
    store = zrecord.DenseStore(tmp_path / "d")
    view = store.bind(zrecord.Allocator())
    generic = zrecord.SourceView(view)
    store.close()
    for read in (len, lambda v: v[0], lambda v: v.gather([1]), lambda v: v.to_arrow(), lambda v: v.to_arrow_batch(), iter, pickle.dumps):
        with pytest.raises(ValueError, match="closed"):
            read(view)
    # A SourceView made before the close keeps its own reference to the mapped store.
    assert np.from_dlpack(generic[1]).tolist() == [2, 3]

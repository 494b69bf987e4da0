import subprocess
import sys
import threading

import numpy as np
import pytest

import zrecord


@pytest.fixture
def stores(tmp_path):
    dense = np.arange(6 * 2 * 3, dtype=np.float32).reshape(6, 2, 3)
    with zrecord.DenseWriter(tmp_path / "d", dense.dtype, (2, 3), "zstd") as w:
        w.append(dense)
    recs = [np.arange(n, dtype=np.int64) * 10 for n in (3, 1, 4, 2)]
    with zrecord.RaggedWriter(tmp_path / "r", np.int64, 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(recs))
    grids = [np.arange(a * b, dtype=np.int16).reshape(a, b) for a, b in ((2, 3), (1, 4), (3, 1))]
    with zrecord.RaggedWriter(tmp_path / "g", np.int16, 2, "zstd") as w:
        w.append(zrecord.RaggedBatch.from_records(grids))
    return tmp_path, dense, recs, grids


def test_pyarrow_dense_fixed_shape_tensor(stores, alloc):
    pa = pytest.importorskip("pyarrow")
    path, dense, _, _ = stores
    view = zrecord.DenseStore(path / "d").bind(alloc)
    t = view[[4, 1]]
    arr = pa.array(t)
    assert arr.type.extension_name == "arrow.fixed_shape_tensor"
    assert list(arr.type.shape) == [2, 3]
    np.testing.assert_array_equal(arr.to_numpy_ndarray(), dense[[4, 1]])
    # Zero-copy: the Arrow values buffer is the batch's memory.
    assert arr.storage.values.buffers()[1].address == t.data_ptr
    table = view.to_arrow()
    assert table.num_rows == 6 and table.column_names == ["d"]
    np.testing.assert_array_equal(table.column("d").combine_chunks().to_numpy_ndarray(), dense)
    sub = view.to_arrow([5, 0])
    np.testing.assert_array_equal(sub.column("d").combine_chunks().to_numpy_ndarray(), dense[[5, 0]])


def test_pyarrow_ragged_list_and_variable_shape(stores, alloc):
    pa = pytest.importorskip("pyarrow")
    path, _, recs, grids = stores
    b = zrecord.RaggedStore(path / "r").bind(alloc)[[2, 0]]
    arr = pa.array(b)
    assert arr.type == pa.list_(pa.field("item", pa.int64(), nullable=False))
    assert arr.to_pylist() == [recs[2].tolist(), recs[0].tolist()]
    assert arr.values.buffers()[1].address == np.from_dlpack(b.values).ctypes.data
    g = zrecord.RaggedStore(path / "g").bind(alloc)
    arr = pa.array(g[[0, 2]])
    assert arr.type.extension_name == "arrow.variable_shape_tensor"
    storage = arr.storage
    assert storage.field("shape").to_pylist() == [[2, 3], [3, 1]]
    assert storage.field("data").to_pylist() == [grids[0].reshape(-1).tolist(), grids[2].reshape(-1).tolist()]
    table = zrecord.RaggedStore(path / "r").bind(alloc).to_arrow()
    assert table.column("r").to_pylist() == [r.tolist() for r in recs]


def test_polars(stores, alloc):
    pl = pytest.importorskip("polars")
    pytest.importorskip("pyarrow")
    path, dense, recs, _ = stores
    df = pl.from_arrow(zrecord.RaggedStore(path / "r").bind(alloc).to_arrow())
    assert df["r"].to_list() == [r.tolist() for r in recs]
    dfd = pl.from_arrow(zrecord.DenseStore(path / "d").bind(alloc).to_arrow())
    assert dfd.height == 6


def test_torch_from_dlpack(stores, alloc):
    torch = pytest.importorskip("torch")
    path, dense, recs, _ = stores
    t = zrecord.DenseStore(path / "d").bind(alloc)[[3, 2]]
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr
    np.testing.assert_array_equal(x.numpy(), dense[[3, 2]])
    b = zrecord.RaggedStore(path / "r").bind(alloc)[[1]]
    assert torch.from_dlpack(b.cu_seqlens).tolist() == [0, 1]


def test_jax_from_dlpack(stores):
    pytest.importorskip("jax")
    path, dense, _, _ = stores
    # In a child interpreter: JAX starts threads at import, and a later fork() in this process
    # (torch DataLoader workers, multiprocessing tests) would copy a process with them running.
    code = f"""
import jax, numpy as np, zrecord
t = zrecord.DenseStore({str(path / "d")!r}).bind(zrecord.Allocator())[[0, 5]]
x = jax.dlpack.from_dlpack(t)
np.save({str(path / "out.npy")!r}, np.asarray(x))
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    np.testing.assert_array_equal(np.load(path / "out.npy"), dense[[0, 5]])


def test_threads_gather_in_parallel(stores):
    path, dense, _, _ = stores
    store = zrecord.DenseStore(path / "d")
    errors = []

    def work(seed):
        try:
            a = zrecord.Allocator("cpu")
            v = store.bind(a)
            rng = np.random.default_rng(seed)
            for _ in range(200):
                ids = rng.integers(0, 6, size=16)
                np.testing.assert_array_equal(np.from_dlpack(v[ids]), dense[ids])
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_dtypes_catalog():
    assert "bfloat16" in zrecord.dtypes.NAMES and len(zrecord.dtypes.NAMES) == 17
    assert zrecord.dtypes.float32 == np.float32
    assert zrecord.dtypes.as_numpy("uint16") == np.uint16

import numpy as np
import pytest

import zrecord
from conftest import CODECS, NUMPY_DTYPES, random_array, writer_kwargs


def make_records(dtype, ndim, n, seed=0):
    rng = np.random.default_rng(seed)
    return [random_array(dtype, tuple(int(x) for x in rng.integers(1, 6, size=ndim)), seed=seed * 1000 + i) for i in range(n)]


def check(batch, records, ids):
    want = [records[i] for i in ids]
    cu = np.from_dlpack(batch.cu_seqlens)
    shapes = np.from_dlpack(batch.shapes)
    assert cu.dtype == np.int32 and shapes.dtype == np.uint64
    np.testing.assert_array_equal(cu, np.concatenate([[0], np.cumsum([r.size for r in want])]).astype(np.int32))
    np.testing.assert_array_equal(shapes, np.array([r.shape for r in want], dtype=np.uint64).reshape(len(ids), -1))
    values = np.from_dlpack(batch.values)
    expect = np.concatenate([r.reshape(-1) for r in want]) if want else np.empty(0, dtype=values.dtype)
    np.testing.assert_array_equal(values, expect)
    assert len(batch) == len(ids)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("ndim", [1, 2])
def test_round_trip(tmp_path, alloc, dtype, codec, ndim):
    records = make_records(dtype, ndim, 29, seed=len(dtype) + ndim)
    path = tmp_path / "r"
    with zrecord.RaggedWriter(path, records[0].dtype, ndim, data_shards=2, **writer_kwargs(codec, records)) as w:
        w.append(zrecord.RaggedBatch.from_records(records[:11]))
        w.append(zrecord.RaggedBatch.from_records(records[11:]))
    with zrecord.RaggedStore(path) as store:
        assert len(store) == 29 and store.ndim == ndim and store.codec == codec
        view = store.bind(alloc)
        check(view[[28, 0, 3, 3]], records, [28, 0, 3, 3])
        check(view[4], records, [4])
        assert view[4].shapes.shape == (1, ndim)
        check(view[2:20:3], records, list(range(2, 20, 3)))
        check(view[np.array([1, 2], dtype=np.int64)], records, [1, 2])
        empty = view[[]]
        np.testing.assert_array_equal(np.from_dlpack(empty.cu_seqlens), [0])
        assert len(empty) == 0
        tensors = view[[7, 1]].to_tensors()
        np.testing.assert_array_equal(np.from_dlpack(tensors[0]), records[7])
        np.testing.assert_array_equal(np.from_dlpack(tensors[1]), records[1])
        assert sum(1 for _ in view) == 29
        assert store.verify() == 29


def test_packed_fields_constructor_and_foreign_append(tmp_path, alloc):
    values = np.arange(10, dtype=np.int32)
    cu = np.array([0, 3, 4, 10], dtype=np.int32)
    shapes = np.array([[3], [1], [6]], dtype=np.uint64)
    with zrecord.RaggedWriter(tmp_path / "r", np.int32, 1, "zstd") as w:
        w.append(zrecord.RaggedBatch(values, cu, shapes))
    b = zrecord.RaggedStore(tmp_path / "r").bind(alloc)[2, 0]
    np.testing.assert_array_equal(np.from_dlpack(b.values), [4, 5, 6, 7, 8, 9, 0, 1, 2])
    np.testing.assert_array_equal(np.from_dlpack(b.cu_seqlens), [0, 6, 9])


def test_transcode_ragged(tmp_path, alloc):
    records = make_records("int32", 1, 200, seed=9)
    with zrecord.RaggedWriter(tmp_path / "a", np.int32, 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(records))
    src = zrecord.RaggedStore(tmp_path / "a").bind(alloc)
    with zrecord.RaggedWriter(tmp_path / "b", src.dtype, src.ndim, "zstd_dict", dict_bytes=zrecord.train_dict(src, 4096)) as w:
        w.append(src[:])
    check(zrecord.RaggedStore(tmp_path / "b").bind(alloc)[:], records, list(range(200)))


def test_from_records_errors():
    with pytest.raises(ValueError, match="at least one"):
        zrecord.RaggedBatch.from_records([])
    with pytest.raises(TypeError):
        zrecord.RaggedBatch.from_records([np.zeros(3, np.int32), np.zeros(3, np.int64)])
    with pytest.raises(ValueError):
        zrecord.RaggedBatch.from_records([np.zeros(3, np.int32), np.zeros((3, 1), np.int32)])
    with pytest.raises(ValueError, match="ndim"):
        zrecord.RaggedBatch.from_records([np.array(3, dtype=np.int32)])
    # A batch may hold empty records (a reader of an allow_empty store returns them); writers
    # refuse them unless created with allow_empty=True (test_seams).
    assert zrecord.RaggedBatch.from_records([np.zeros(0, np.int32)]).to_tensors()[0].shape == (0,)

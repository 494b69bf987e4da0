import numpy as np
import pytest

import zrecord


@pytest.fixture
def dense(tmp_path):
    data = np.arange(40, dtype=np.float32).reshape(10, 4)
    with zrecord.DenseWriter(tmp_path / "d", np.float32, (4,), "zstd") as w:
        w.append(data)
    return tmp_path / "d"


def test_writer_validation(tmp_path):
    w = zrecord.DenseWriter(tmp_path / "x", np.float32, (2, 3), "raw")
    with pytest.raises(TypeError, match="dtype mismatch"):
        w.append(np.zeros((2, 2, 3), np.float64))
    with pytest.raises(ValueError, match="shape mismatch"):
        w.append(np.zeros((2, 3, 2), np.float32))
    with pytest.raises(ValueError, match="not C-contiguous"):
        w.append(np.zeros((2, 3, 2), np.float32).transpose(0, 2, 1))
    with pytest.raises(TypeError, match="DLPack"):
        w.append([[1.0, 2.0]])
    assert len(w) == 0
    w.append(np.zeros((1, 2, 3), np.float32))
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.append(np.zeros((1, 2, 3), np.float32))


def test_ragged_validation(tmp_path):
    w = zrecord.RaggedWriter(tmp_path / "r", np.int32, 1, "raw")
    v = np.arange(5, dtype=np.int32)
    cases = [
        (np.array([1, 3, 5], np.int32), np.array([[2], [2]], np.uint64), "start at 0"),
        (np.array([0, 3, 3, 5], np.int32), np.array([[3], [0], [2]], np.uint64), "empty"),
        (np.array([0, 3, 2, 5], np.int32), np.array([[3], [1], [3]], np.uint64), "strictly increase"),
        (np.array([0, 3, 4], np.int32), np.array([[3], [1]], np.uint64), "ends at 4"),
        (np.array([0, 3, 5], np.int32), np.array([[3], [3]], np.uint64), "holds 3 elements"),
    ]
    for cu, shapes, msg in cases:
        with pytest.raises(ValueError, match=msg):
            w.append(zrecord.RaggedBatch(v, cu, shapes))
    with pytest.raises(TypeError, match="cu_seqlens"):
        w.append(zrecord.RaggedBatch(v, np.array([0, 5], np.int64), np.array([[5]], np.uint64)))
    with pytest.raises(TypeError, match="shapes"):
        w.append(zrecord.RaggedBatch(v, np.array([0, 5], np.int32), np.array([[5]], np.int64)))
    with pytest.raises(TypeError, match="RaggedBatch"):
        w.append(v)
    with pytest.raises(ValueError, match="ndim"):
        zrecord.RaggedWriter(tmp_path / "r0", np.int32, 0, "raw")
    w.abort()
    assert not (tmp_path / "r").exists()


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="codec"):
        zrecord.DenseWriter(tmp_path / "x", np.uint8, (1,), "lz4")
    with pytest.raises(ValueError, match="dictionary"):
        zrecord.DenseWriter(tmp_path / "x", np.uint8, (1,), "zstd_dict")
    with pytest.raises(ValueError, match="data_shards"):
        zrecord.DenseWriter(tmp_path / "x", np.uint8, (1,), "raw", data_shards=0)
    with pytest.raises(ValueError, match="data_shards"):
        zrecord.DenseWriter(tmp_path / "x", np.uint8, (1,), "raw", data_shards=256)
    with pytest.raises(TypeError):
        zrecord.DenseWriter(tmp_path / "x", ">f4", (1,), "raw")
    with pytest.raises(TypeError):
        zrecord.DenseWriter(tmp_path / "x", np.dtype(">f4"), (1,), "raw")
    with pytest.raises(TypeError):
        zrecord.DenseWriter(tmp_path / "x", np.dtype([("a", "i4")]), (1,), "raw")
    with pytest.raises(TypeError):
        zrecord.DenseWriter(tmp_path / "x", object, (1,), "raw")
    with pytest.raises(ValueError):
        zrecord.Allocator("cuda")
    assert not (tmp_path / "x").exists()


def test_exists_and_not_found(tmp_path, dense):
    with pytest.raises(FileExistsError):
        zrecord.DenseWriter(dense, np.float32, (4,), "raw")
    with pytest.raises(FileNotFoundError):
        zrecord.DenseStore(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        zrecord.open(tmp_path / "nope")
    with pytest.raises(TypeError, match="not ragged"):
        zrecord.RaggedStore(dense)


def test_index_errors(dense, alloc):
    view = zrecord.DenseStore(dense).bind(alloc)
    for bad in [10, -1, [0, 10], (3, -2), np.array([1, 99])]:
        with pytest.raises(IndexError):
            view[bad]
    with pytest.raises(TypeError):
        view["a"]
    with pytest.raises(TypeError):
        view[np.array([0.5])]
    with pytest.raises(ValueError):
        view[np.zeros((2, 2), np.int64)]


def test_exit_on_exception_publishes_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with zrecord.DenseWriter(tmp_path / "x", np.uint8, (2,), "zstd") as w:
            w.append(np.zeros((4, 2), np.uint8))
            raise RuntimeError("boom")
    assert not (tmp_path / "x").exists()
    assert list(tmp_path.iterdir()) == []


def test_corrupt_store(dense, alloc):
    shard = next(p for p in dense.iterdir() if p.name.startswith("data-") and p.stat().st_size > 64)
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    store = zrecord.DenseStore(dense)
    with pytest.raises(zrecord.CorruptStoreError) as e:
        store.verify()
    assert shard.name in str(e.value)
    assert isinstance(e.value, OSError)
    view = store.bind(alloc)
    with pytest.raises(zrecord.CorruptStoreError):
        view[:]
    (dense / "index.bin").write_bytes((dense / "index.bin").read_bytes()[:-1])
    with pytest.raises(zrecord.CorruptStoreError, match="index.bin"):
        zrecord.DenseStore(dense)


def test_closed_store_invalidates_views(dense, alloc):
    store = zrecord.DenseStore(dense)
    view = store.bind(alloc)
    t = view[[1, 2]]
    store.close()
    assert store.closed
    with pytest.raises(ValueError, match="closed"):
        view[0]
    with pytest.raises(ValueError, match="closed"):
        len(view)
    with pytest.raises(ValueError, match="closed"):
        store.bind(alloc)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4, 12, dtype=np.float32).reshape(2, 4))
    with zrecord.DenseStore(dense) as s2:
        v2 = s2.bind(alloc)
    with pytest.raises(ValueError):
        v2[0]


@pytest.mark.parametrize("bad", ["000-a\x00x", "\x00", "000-a\n", "sub/\x1f"])
def test_dataset_json_with_unnameable_stream_path_is_corrupt_naming_the_field(tmp_path, bad):
    import json

    import pyarrow as pa

    root = tmp_path / "root"
    zrecord.write_dataset(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), root, progress=False)
    meta = json.loads((root / "dataset.json").read_text())
    meta["streams"][1]["path"] = bad
    (root / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(zrecord.CorruptStoreError, match=r"stream 'b': field 'path'.*(NUL byte|control character)"):
        zrecord.Dataset(root)
    # The adapters' root-or-store test and SQL registration report the same.
    ctx = zrecord.SessionContext()
    with pytest.raises(zrecord.CorruptStoreError, match="field 'path'"):
        ctx.register("t", root)

"""The seams from Python: a record source written in this test module is loaded by the Loader,
read as Arrow and queried with SQL; format-v2 string stores and empty records; the streaming
DatasetWriter; soundness of exported ragged metadata; version-1 stores."""

import ctypes
from pathlib import Path

import numpy as np
import pytest

import zrecord

pa = pytest.importorskip("pyarrow")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "v1"


class Squares:
    """A dense toy source: record i is the int64 pair (i, i * i)."""

    dtype = np.int64
    item_shape = (2,)
    name = "squares"

    def __init__(self, n):
        self.n = n
        self.calls = 0

    def __len__(self):
        return self.n

    def gather(self, ids):
        self.calls += 1
        ids = np.from_dlpack(ids).astype(np.int64)
        return np.stack([ids, ids * ids], axis=1)


class Words:
    """A ragged utf8 toy source: record i is the text 'w' * (i % 3) (empty for multiples of 3)."""

    dtype = np.uint8
    ndim = 1
    logical = "utf8"

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def gather(self, ids):
        recs = [np.frombuffer(("w" * (int(i) % 3)).encode(), dtype=np.uint8) for i in np.from_dlpack(ids)]
        return zrecord.RaggedBatch.from_records(recs)


def test_python_source_reads_through_views_loader_and_arrow_loader(alloc):
    sq = Squares(30)
    view = zrecord.SourceView(sq, alloc)
    assert (len(view), view.kind, view.item_shape, view.name) == (30, "dense", (2,), "squares")
    np.testing.assert_array_equal(np.from_dlpack(view[[4, 2, 4]]), [[4, 16], [2, 4], [4, 16]])
    np.testing.assert_array_equal(np.from_dlpack(view[7]), [7, 49])
    with pytest.raises(IndexError):
        view[[30]]
    sampler = zrecord.Sampler(30, 6, zrecord.Sampler.Mode.CYCLIC, seed=3)
    loader = zrecord.Loader({"sq": [view]}, sampler, workers=2)
    seen = []
    for _ in range(5):
        (part,) = next(loader)
        x = np.from_dlpack(part["sq"])
        np.testing.assert_array_equal(x[:, 1], x[:, 0] * x[:, 0])
        seen.extend(x[:, 0].tolist())
    assert sorted(seen) == list(range(30)), "one cyclic epoch, every record once"
    loader.close()
    words = zrecord.SourceView(Words(9), alloc)
    t = pa.table(zrecord.ArrowLoader({"w": [words]}, zrecord.Sampler(9, 3, zrecord.Sampler.Mode.SEQUENTIAL), steps=3))
    assert t.column("w").type == pa.string_view()
    assert t.column("w").to_pylist() == ["w" * (i % 3) for i in range(9)]
    # A Python source without a `name` is the stream "data".
    assert words.name == "data" and pa.table(words.to_arrow_batch([2, 0])).column("data").to_pylist() == ["ww", ""]


def test_python_source_is_queried_with_sql(alloc):
    ctx = zrecord.SessionContext()
    ctx.register_sources("toy", {"sq": Squares(20), "w": Words(20)})
    t = ctx.sql("SELECT _id, sq, w FROM toy WHERE _id IN (3, 11, 4) ORDER BY _id").to_arrow()
    assert t.column("_id").to_pylist() == [3, 4, 11]
    assert t.column("w").to_pylist() == ["", "w", "ww"]
    assert t.column("sq").combine_chunks().to_numpy_ndarray().tolist() == [[3, 9], [4, 16], [11, 121]]
    g = ctx.sql("SELECT _id FROM gather('toy', [7, 7, 0])").to_arrow()
    assert g.column("_id").to_pylist() == [7, 7, 0]
    with pytest.raises(ValueError, match="aligned"):
        ctx.register_sources("bad", {"a": Squares(3), "b": Words(4)})


class Broken:
    dtype = np.float32
    item_shape = (3,)

    def __len__(self):
        return 5

    def gather(self, ids):
        return np.zeros((len(np.from_dlpack(ids)), 2), np.float32)


def test_python_source_contract_violations_are_errors(alloc):
    v = zrecord.SourceView(Broken(), alloc)
    with pytest.raises(ValueError, match="expected"):
        v[[0, 1]]
    with pytest.raises(TypeError, match="gather"):
        zrecord.SourceView(object(), alloc)


def test_v2_string_store_reads_back_as_strings_everywhere(tmp_path, alloc):
    texts = ["alpha", "", "ünïcode", "a longer string of more than twelve bytes", ""]
    recs = [np.frombuffer(t.encode(), dtype=np.uint8) for t in texts]
    with zrecord.RaggedWriter(tmp_path / "s", np.uint8, 1, "zstd", logical="utf8", allow_empty=True) as w:
        w.append(zrecord.RaggedBatch.from_records(recs))
    store = zrecord.open(tmp_path / "s")
    assert (store.logical, store.format_version) == ("utf8", 2)
    view = store.bind(alloc)
    assert view.to_arrow().column("s").to_pylist() == texts
    t = pa.table(zrecord.ArrowLoader({"s": [view]}, zrecord.Sampler(5, 5, zrecord.Sampler.Mode.SEQUENTIAL), steps=1))
    assert t.column("s").to_pylist() == texts
    ctx = zrecord.SessionContext()
    ctx.register("s", tmp_path / "s")
    assert ctx.sql("SELECT s FROM s ORDER BY _id").to_arrow().column("s").to_pylist() == texts
    b = view[[1, 2]]
    np.testing.assert_array_equal(np.from_dlpack(b.shapes), [[0], [len(texts[2].encode())]])


def test_empty_records_need_allow_empty(tmp_path):
    recs = [np.arange(3, dtype=np.int32), np.zeros(0, np.int32)]
    batch = zrecord.RaggedBatch.from_records(recs)
    with zrecord.RaggedWriter(tmp_path / "strict", np.int32, 1, "raw") as w:
        with pytest.raises(ValueError, match="allow_empty"):
            w.append(batch)
    with pytest.raises(ValueError, match="logical"):
        zrecord.RaggedWriter(tmp_path / "bad", np.int32, 1, "raw", logical="utf8")


def test_allow_empty_applies_to_ragged_columns_of_mixed_tables(tmp_path):
    """allow_empty is about ragged records: every writer of Arrow-shaped data (write_dataset,
    convert, DatasetWriter, COPY) accepts it next to dense columns, empty records come back
    empty, and the dense columns are unaffected."""
    table = pa.table({
        "k": pa.array([1, 2, 3], pa.int64()),
        "v": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32(), 2)),
        "t": ["a", "", "ccc"],
        "r": pa.array([[1], [], [2, 3]], pa.list_(pa.int32())),
    })

    def check(root):
        got = zrecord.SessionContext()
        got.register("x", root)
        back = got.sql("SELECT k, v, t, r FROM x ORDER BY _id").to_arrow()
        assert back.column("k").to_pylist() == [1, 2, 3]
        assert back.column("v").to_pylist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
        assert back.column("t").to_pylist() == ["a", "", "ccc"]
        assert back.column("r").to_pylist() == [[1], [], [2, 3]]

    assert zrecord.write_dataset(table, tmp_path / "w", allow_empty=True, progress=False) == 3
    check(tmp_path / "w")
    zrecord.convert(table, tmp_path / "c", allow_empty=True, progress=False)
    check(tmp_path / "c")
    with zrecord.DatasetWriter(tmp_path / "d", codec="zstd", allow_empty=True) as w:
        w.write(table)
    check(tmp_path / "d")
    # Without the flag the empty record is refused, naming the column and row.
    with pytest.raises(ValueError, match=r"column 't' row 1 is empty.*allow_empty"):
        zrecord.write_dataset(table, tmp_path / "strict", progress=False)
    assert not (tmp_path / "strict").exists()
    # COPY takes the same option (the error above tells SQL users to use it).
    ctx = zrecord.SessionContext()
    ctx.register_arrow("src", table)
    with pytest.raises(ValueError, match="allow_empty"):
        ctx.sql(f"COPY (SELECT * FROM src) TO '{tmp_path / 'q0'}' STORED AS ZRECORD").to_arrow()
    ctx.sql(f"COPY (SELECT * FROM src) TO '{tmp_path / 'q'}' STORED AS ZRECORD OPTIONS (allow_empty 'true', codec 'zstd')").to_arrow()
    check(tmp_path / "q")
    with pytest.raises(ValueError, match="allow_empty.*not a boolean"):
        ctx.sql(f"COPY (SELECT * FROM src) TO '{tmp_path / 'q2'}' STORED AS ZRECORD OPTIONS (allow_empty 'maybe')").to_arrow()


def test_dataset_writer_streams_batches_and_publishes_atomically(tmp_path):
    schema = pa.schema([("x", pa.int64()), ("s", pa.string())])
    batches = [pa.record_batch([pa.array(range(i * 4, i * 4 + 4)), pa.array([f"r{j}" for j in range(i * 4, i * 4 + 4)])], schema=schema) for i in range(5)]
    reader = pa.RecordBatchReader.from_batches(schema, iter(batches))
    with zrecord.DatasetWriter(tmp_path / "d", codec="zstd") as w:
        assert w.write(reader) == 20
        assert not (tmp_path / "d").exists(), "nothing is visible before close"
        w.write(batches[0])  # a single batch (__arrow_c_array__) appends too
    assert len(w) == 24
    ctx = zrecord.SessionContext()
    ctx.register("d", tmp_path / "d")
    t = ctx.sql("SELECT x, s FROM d ORDER BY _id").to_arrow()
    assert t.column("x").to_pylist() == list(range(20)) + [0, 1, 2, 3]
    assert t.column("s").to_pylist()[-1] == "r3"
    with pytest.raises(FileExistsError):
        zrecord.DatasetWriter(tmp_path / "d")
    with pytest.raises(RuntimeError):
        with zrecord.DatasetWriter(tmp_path / "e") as w:
            w.write(batches[0])
            raise RuntimeError("boom")
    assert not (tmp_path / "e").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["d"], "no staging folder left"
    assert zrecord.write_dataset(pa.table({"a": [1, 2, 3]}), tmp_path / "f") == 3


def test_written_garbage_in_exported_cu_seqlens_is_an_error(alloc):
    b = zrecord.RaggedBatch.from_records([np.arange(4, dtype=np.int32), np.arange(2, dtype=np.int32)])
    cu = np.from_dlpack(b.cu_seqlens)
    if np.lib.NumpyVersion(np.__version__) >= "2.1.0":
        assert not cu.flags.writeable, "metadata is exported read-only"
    # A consumer that ignores the flag writes anyway.
    ptr = cu.__array_interface__["data"][0]
    (ctypes.c_int32 * 3).from_address(ptr)[1] = 1 << 30
    with pytest.raises(ValueError, match="cu_seqlens"):
        b.to_tensors()
    with pytest.raises(ValueError):
        pa.array(b)


@pytest.mark.skipif(not FIXTURES.exists(), reason="fixtures not in this tree")
def test_version_1_stores_still_read(alloc):
    d = zrecord.open(FIXTURES / "dense_f32_zstd")
    assert (d.format_version, d.logical) == (1, "tensor")
    x = np.from_dlpack(d.bind(alloc)[[11, 0]])
    np.testing.assert_array_equal(x[1].ravel(), np.arange(6) * 0.5)
    ctx = zrecord.SessionContext()
    ctx.register("v1", FIXTURES / "dataset")
    t = ctx.sql("SELECT text FROM v1 ORDER BY _id LIMIT 2").to_arrow()
    assert t.column("text").to_pylist() == ["record 0: ", "record 1: é"]

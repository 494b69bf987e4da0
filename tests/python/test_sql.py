"""SQL from Python: zrecord.SessionContext, pyarrow / polars interop of query results, pyarrow's
own tensor extension types in both directions, and datafusion-python FFI registration."""

import numpy as np
import pytest

import zrecord

pa = pytest.importorskip("pyarrow")


@pytest.fixture
def root(tmp_path):
    """A dataset root: `image` float32 [2, 3], `label` int64, `tokens` ragged int32, `grid` ragged
    int16 ndim 2; 12 records."""
    n = 12
    images = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 4
    labels = np.arange(n, dtype=np.int64) % 3
    tokens = [np.arange(i % 5 + 1, dtype=np.int32) + 100 * i for i in range(n)]
    grids = [np.arange((i % 2 + 1) * 2, dtype=np.int16).reshape(i % 2 + 1, 2) + i for i in range(n)]
    r = tmp_path / "root"
    with zrecord.DenseWriter(r / "image", np.float32, (2, 3), "zstd") as w:
        w.append(images)
    with zrecord.DenseWriter(r / "label", np.int64, (), "raw") as w:
        w.append(labels)
    with zrecord.RaggedWriter(r / "tokens", np.int32, 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(tokens))
    with zrecord.RaggedWriter(r / "grid", np.int16, 2, "zstd") as w:
        w.append(zrecord.RaggedBatch.from_records(grids))
    return r, images, labels, tokens, grids


def test_query_to_pyarrow_and_polars(root):
    path, images, labels, tokens, _ = root
    ctx = zrecord.SessionContext(target_partitions=2, batch_size=5)
    ctx.register("t", path)
    assert ctx.tables() == ["t"]
    res = ctx.sql("SELECT _id, image, label, tokens FROM t WHERE _id IN (7, 2, 11) ORDER BY _id")
    assert res.columns == ["_id", "image", "label", "tokens"]
    table = res.to_arrow()
    assert table.column("_id").to_pylist() == [2, 7, 11]
    # pyarrow recognises our fixed_shape_tensor and reads the exact values.
    img = table.column("image").combine_chunks()
    assert isinstance(img.type, pa.FixedShapeTensorType)
    assert list(img.type.shape) == [2, 3]
    np.testing.assert_array_equal(img.to_numpy_ndarray(), images[[2, 7, 11]])
    assert table.column("label").to_pylist() == labels[[2, 7, 11]].tolist()
    assert table.column("tokens").to_pylist() == [tokens[i].tolist() for i in (2, 7, 11)]
    # Same result through the PyCapsule stream, and into polars.
    again = pa.table(res)
    assert again.column("_id").to_pylist() == [2, 7, 11]
    pl = pytest.importorskip("polars")
    df = res.to_polars()
    assert df["label"].to_list() == labels[[2, 7, 11]].tolist()
    assert pl.from_arrow(pa.RecordBatchReader.from_stream(res).read_all())["_id"].to_list() == [2, 7, 11]


def test_variable_shape_tensor_reads_as_pyarrow_extension(root):
    """pyarrow (26) has no Python VariableShapeTensorType, but its C++ core recognises our
    metadata as the canonical extension (value type and ndim)."""
    path, _, _, _, grids = root
    ctx = zrecord.SessionContext()
    ctx.register("t", path)
    t = ctx.sql("SELECT grid FROM gather('t', [3, 0])").to_arrow()
    col = t.column("grid").combine_chunks()
    assert col.type.extension_name == "arrow.variable_shape_tensor"
    assert "value_type=int16, ndim=2" in str(col.type)
    for row, i in zip(col.storage.to_pylist(), (3, 0)):
        assert row["shape"] == list(grids[i].shape)
        np.testing.assert_array_equal(np.array(row["data"], dtype=np.int16).reshape(row["shape"]), grids[i])


def test_copy_pyarrow_tensor_types_in_and_read_back(tmp_path):
    """pyarrow writes the tensor extension types; we read its metadata, store, and give back
    types pyarrow reads again with equal values."""
    arr = np.arange(4 * 2 * 3, dtype=np.float64).reshape(4, 2, 3)
    fst = pa.FixedShapeTensorArray.from_numpy_ndarray(arr)
    # pyarrow's own variable_shape_tensor (C++ canonical type, as pyarrow exports it).
    grids = [np.arange(a * b, dtype=np.int32).reshape(a, b) for a, b in ((1, 2), (2, 2), (3, 1), (1, 1))]
    with zrecord.RaggedWriter(tmp_path / "g", np.int32, 2, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(grids))
    c0 = zrecord.SessionContext()
    c0.register("g", tmp_path / "g")
    vst = c0.sql("SELECT g FROM g ORDER BY _id").to_arrow().column("g").combine_chunks()
    assert vst.type.extension_name == "arrow.variable_shape_tensor"
    text = pa.array(["a", "ß", "longer than twelve bytes", "z"])
    src = pa.table({"x": fst, "g": vst, "s": text, "n": pa.array([1.5, 2.5, 3.5, 4.5])})
    ctx = zrecord.SessionContext()
    ctx.register_arrow("src", src)
    out = tmp_path / "conv"
    r = ctx.sql(f"COPY src TO '{out}' STORED AS ZRECORD OPTIONS (codec 'zstd')").to_arrow()
    assert r.column(0).to_pylist() == [4]
    ctx.register("back", out)
    back = ctx.sql("SELECT * FROM back ORDER BY _id").to_arrow()
    x = back.column("x").combine_chunks()
    assert isinstance(x.type, pa.FixedShapeTensorType)
    np.testing.assert_array_equal(x.to_numpy_ndarray(), arr)
    g = back.column("g").combine_chunks()
    assert g.type.extension_name == "arrow.variable_shape_tensor"
    for row, want in zip(g.storage.to_pylist(), grids):
        np.testing.assert_array_equal(np.array(row["data"], dtype=np.int32).reshape(row["shape"]), want)
    assert back.column("s").type == pa.string_view()
    assert back.column("s").to_pylist() == text.to_pylist()
    assert back.column("n").to_pylist() == [1.5, 2.5, 3.5, 4.5]
    info = ctx.sql("SELECT stream, kind, dtype, shape, logical FROM zrecord_info('back')").to_arrow().to_pylist()
    assert info == [
        {"stream": "x", "kind": "dense", "dtype": "float64", "shape": "[2, 3]", "logical": "tensor"},
        {"stream": "g", "kind": "ragged", "dtype": "int32", "shape": "ndim 2", "logical": "tensor"},
        {"stream": "s", "kind": "ragged", "dtype": "uint8", "shape": "ndim 1", "logical": "utf8"},
        {"stream": "n", "kind": "dense", "dtype": "float64", "shape": "[]", "logical": "tensor"},
    ]
    # The stored streams are ordinary stores: read them with the store API too.
    s = zrecord.open(out / "000-x").bind(zrecord.Allocator())
    np.testing.assert_array_equal(np.from_dlpack(s[[3, 0]]), arr[[3, 0]])


def test_a_stream_opened_alone_keeps_its_name(tmp_path):
    """One name per stream: root/001-label registered alone is column `label` (the name in the
    root's dataset.json), as when the root is registered; a store outside a root is named after
    its folder."""
    zrecord.write_dataset(pa.table({"x": pa.array([1.5, 2.5, 3.5]), "label": pa.array([7, 8, 9])}), tmp_path / "root")
    ctx = zrecord.SessionContext()
    ctx.register("lone", tmp_path / "root" / "001-label")
    assert ctx.sql("SELECT _id, label FROM lone ORDER BY _id").to_arrow().to_pydict() == {"_id": [0, 1, 2], "label": [7, 8, 9]}
    ctx.register("whole", tmp_path / "root")
    assert ctx.sql("SELECT l.label FROM lone l JOIN whole w ON l._id = w._id AND l.label = w.label ORDER BY l._id").to_arrow().column(0).to_pylist() == [7, 8, 9]
    with zrecord.DenseWriter(tmp_path / "scores", np.float32, (), "raw") as w:
        w.append(np.array([0.5, 0.25], np.float32))
    ctx.register("s", tmp_path / "scores")
    assert ctx.sql("SELECT scores FROM s ORDER BY _id").to_arrow().column(0).to_pylist() == [0.5, 0.25]


def test_polars_frame_converts_through_sql(tmp_path):
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"tokens": [[1, 2], [3], [4, 5, 6]], "label": [0, 1, 0]})
    ctx = zrecord.SessionContext()
    ctx.register_arrow("src", df)
    ctx.sql(f"COPY src TO '{tmp_path / 'p'}' STORED AS ZRECORD")
    ctx.register("p", tmp_path / "p")
    back = ctx.sql("SELECT tokens, label FROM p ORDER BY _id").to_polars()
    assert back["tokens"].to_list() == [[1, 2], [3], [4, 5, 6]]
    assert back["label"].to_list() == [0, 1, 0]


def test_loader_query_streams_steps(root):
    path, _, labels, _, _ = root
    ctx = zrecord.SessionContext()
    ctx.register("t", path)
    res = ctx.sql("SELECT _step, _id, label FROM loader('t', 4, 'cyclic', 9) LIMIT 12")
    t = res.to_arrow()
    assert t.num_rows == 12
    ids = np.array(t.column("_id").to_pylist())
    s = zrecord.Sampler(12, 4, "cyclic", 9)
    want = np.concatenate([np.asarray(s.batch(k)) for k in range(3)])
    np.testing.assert_array_equal(ids, want)
    assert sorted(ids.tolist()) == list(range(12))  # one cycle: a permutation
    np.testing.assert_array_equal(np.array(t.column("label").to_pylist()), labels[ids])
    # The stream reads incrementally: batches arrive without draining an endless loader.
    reader = pa.RecordBatchReader.from_stream(ctx.sql("SELECT _id FROM loader('t', 4, 'iid', 1)"))
    first = reader.read_next_batch()
    assert first.num_rows == 4
    steps = []
    for batch in ctx.sql("SELECT _step, _id FROM loader('t', 3, 'sequential', 0)"):
        steps.append(batch.column(0).to_pylist())
        if len(steps) == 5:
            break
    assert steps == [[k] * 3 for k in range(5)]


def test_errors_map_to_python_exceptions(root, tmp_path):
    path = root[0]
    ctx = zrecord.SessionContext()
    ctx.register("t", path)
    with pytest.raises(FileNotFoundError):
        ctx.register("nope", tmp_path / "missing")
    with pytest.raises(IndexError, match="index 12 out of range"):
        ctx.sql("SELECT * FROM gather('t', [12])")
    with pytest.raises(FileExistsError):
        ctx.sql(f"COPY (SELECT label FROM t) TO '{path}' STORED AS ZRECORD")
    with pytest.raises(ValueError, match="has a null at row 1"):
        ctx.sql(f"COPY (SELECT * FROM (VALUES (1), (NULL)) AS v(x)) TO '{tmp_path / 'n'}' STORED AS ZRECORD")
    assert not (tmp_path / "n").exists()
    with pytest.raises(ValueError):
        ctx.sql("SELEC nonsense")
    with pytest.raises(ValueError):
        zrecord.SessionContext(batch_size=0)
    with pytest.raises(TypeError):
        ctx.register_arrow("x", 42)


def test_explain_shows_pushdown(root):
    ctx = zrecord.SessionContext()
    ctx.register("t", root[0])
    plan = ctx.sql("SELECT label FROM t WHERE _id BETWEEN 2 AND 4").explain()
    assert "ZrecordScanExec" in plan
    assert "ids=[2..5] (3 of 12)" in plan
    assert "streams=[label]" in plan


def test_table_registers_in_datafusion_python(root):
    datafusion = pytest.importorskip("datafusion")
    path, images, labels, tokens, _ = root
    table = zrecord.Table(path)
    assert len(table) == 12
    assert table.columns == ["_id", "grid", "image", "label", "tokens"]
    ctx = datafusion.SessionContext()
    ctx.register_table("t", table)
    got = ctx.sql("SELECT _id, label, tokens FROM t WHERE _id IN (1, 5) ORDER BY _id").to_arrow_table()
    assert got.column("_id").to_pylist() == [1, 5]
    assert got.column("label").to_pylist() == labels[[1, 5]].tolist()
    assert got.column("tokens").to_pylist() == [tokens[1].tolist(), tokens[5].tolist()]
    # Same rows as zrecord's own context.
    zctx = zrecord.SessionContext()
    zctx.register("t", path)
    ours = zctx.sql("SELECT _id, label FROM t WHERE label = 2 ORDER BY _id").to_arrow()
    theirs = ctx.sql("SELECT _id, label FROM t WHERE label = 2 ORDER BY _id").to_arrow_table()
    assert ours.to_pylist() == theirs.to_pylist()
    img = ctx.sql("SELECT image FROM t WHERE _id = 3").to_arrow_table().column("image").combine_chunks()
    np.testing.assert_array_equal(np.asarray(img.storage.flatten()).reshape(-1, 2, 3), images[[3]])


def test_write_dataset_from_arrow_and_polars(tmp_path):
    src = pa.table({"tokens": pa.array([[1, 2, 3], [4], [5, 6]], pa.list_(pa.int32())),
                    "label": pa.array([0, 1, 1], pa.int64()),
                    "text": pa.array(["x", "it's", "z"])})
    out = tmp_path / "it's here"
    assert zrecord.write_dataset(src, out, codec="zstd", level=7, data_shards=2) == 3
    ctx = zrecord.SessionContext()
    ctx.register("d", out)
    back = ctx.sql("SELECT tokens, label, text FROM d ORDER BY _id").to_arrow()
    assert back.column("tokens").to_pylist() == [[1, 2, 3], [4], [5, 6]]
    assert back.column("text").to_pylist() == ["x", "it's", "z"]
    info = ctx.sql("SELECT DISTINCT codec, level FROM zrecord_info('d')").to_arrow().to_pylist()
    assert info == [{"codec": "zstd", "level": 7}]
    with pytest.raises(FileExistsError):
        zrecord.write_dataset(src, out)
    pl = pytest.importorskip("polars")
    assert zrecord.write_dataset(pl.DataFrame({"x": [1.0, 2.0]}), tmp_path / "pl") == 2


def test_prepared_statements_bind_numpy_ids(root):
    path, images, labels, tokens, _ = root
    ctx = zrecord.SessionContext(target_partitions=2, batch_size=5)
    ctx.register("t", path)
    q = ctx.prepare("SELECT _id, image, label, tokens FROM t WHERE _id = ANY($1)")
    assert isinstance(q, zrecord.PreparedStatement)
    assert q.parameters == ["$1"] and q.reuses_plan
    # Any integer array, any order, duplicates and ids past the end: rows in id order (as IN).
    for ids in (np.array([7, 2, 11, 2, 40], dtype=np.int64), np.array([11, 7, 2], dtype=np.uint32), [2, 11, 7, 7]):
        t = q.lookup(ids).to_arrow()
        assert t.column("_id").to_pylist() == [2, 7, 11]
        np.testing.assert_array_equal(t.column("image").combine_chunks().to_numpy_ndarray(), images[[2, 7, 11]])
        assert t.column("label").to_pylist() == labels[[2, 7, 11]].tolist()
        assert t.column("tokens").to_pylist() == [tokens[i].tolist() for i in (2, 7, 11)]
    # More rows than one batch (batch_size 5), a strided view, and execute() with the array.
    ids = np.arange(12, dtype=np.int64)[::-1][::2]
    t = q.execute(ids).to_arrow()
    assert t.column("_id").to_pylist() == sorted(ids.tolist())
    assert q.lookup(np.array([], dtype=np.int64)).to_arrow().num_rows == 0
    # Same rows as the literal query.
    lit = ctx.sql("SELECT _id, label FROM t WHERE _id IN (3, 9) ORDER BY _id").to_arrow()
    got = ctx.prepare("SELECT _id, label FROM t WHERE _id = ANY($1)").lookup([9, 3]).to_arrow()
    assert got.equals(lit)
    # Mixed parameters: an id list and a value, re-planned per execution.
    q2 = ctx.prepare("SELECT _id FROM t WHERE _id = ANY($1) AND label = $2")
    assert q2.parameters == ["$1", "$2"] and not q2.reuses_plan
    assert sorted(q2.execute(np.arange(12), 1).to_arrow().column("_id").to_pylist()) == [i for i in range(12) if i % 3 == 1]
    one = ctx.prepare("SELECT label FROM t WHERE _id = $1")
    assert one.execute(np.int64(4)).to_arrow().column("label").to_pylist() == [labels[4]]
    # Errors.
    with pytest.raises(IndexError, match="non-negative"):
        q.lookup(np.array([1, -1]))
    with pytest.raises(TypeError):
        q.lookup(np.array([1.5]))
    with pytest.raises(TypeError):
        q.execute(object())
    with pytest.raises(ValueError, match="1 parameters, 2 values"):
        q.execute([1], [2])
    with pytest.raises(ValueError, match="binds _id values"):
        q.execute("seven")
    with pytest.raises(ValueError, match="only queries can be prepared"):
        ctx.prepare("CREATE TABLE x AS SELECT 1")
    # The same statement through SQL PREPARE / EXECUTE.
    ctx.sql("PREPARE p(BIGINT[]) AS SELECT _id FROM t WHERE _id = ANY($1)")
    assert ctx.sql("EXECUTE p([8, 1])").to_arrow().column("_id").to_pylist() == [1, 8]


def test_prepared_gather_keeps_order_and_duplicates(root):
    path, images, labels, tokens, _ = root
    ctx = zrecord.SessionContext(target_partitions=2, batch_size=5)
    ctx.register("t", path)
    q = ctx.prepare("SELECT _id, image, label, tokens FROM gather('t', $1)")
    assert q.parameters == ["$1"] and q.reuses_plan
    for ids in (np.array([7, 2, 11, 2, 0], dtype=np.int64), np.array([11, 7, 2], dtype=np.uint32)[::-1], [3, 3, 3]):
        want = np.asarray(ids)
        t = q.lookup(ids).to_arrow()
        assert t.column("_id").to_pylist() == want.tolist()
        np.testing.assert_array_equal(t.column("image").combine_chunks().to_numpy_ndarray(), images[want])
        assert t.column("label").to_pylist() == labels[want].tolist()
        assert t.column("tokens").to_pylist() == [tokens[i].tolist() for i in want]
        assert q.execute(ids).to_arrow().equals(t)
        lit = ctx.sql(f"SELECT _id, image, label, tokens FROM gather('t', [{', '.join(map(str, want.tolist()))}])").to_arrow()
        assert lit.equals(t)
    with pytest.raises(IndexError, match="12"):
        q.lookup([1, 12])
    with pytest.raises(IndexError, match="non-negative"):
        q.execute([1, -1])
    # A filter keeps the gather's order; SQL EXECUTE says where such a statement runs.
    assert ctx.prepare("SELECT _id FROM gather('t', $1) WHERE label = 1").lookup([10, 4, 1, 4]).to_arrow().column("_id").to_pylist() == [i for i in (10, 4, 1, 4) if labels[i] == 1]
    with pytest.raises(ValueError, match="parameters"):
        ctx.sql("PREPARE g(BIGINT[]) AS SELECT _id FROM gather('t', $1)")
    with pytest.raises(ValueError, match="prepared statement's execution"):
        ctx.sql("SELECT _id FROM gather('t', $1)").to_arrow()


def test_in_list_queries_reuse_plans_and_follow_catalog_changes(root, tmp_path):
    path, images, labels, _, _ = root
    ctx = zrecord.SessionContext(batch_size=5)
    ctx.register("t", path)
    # The same shape with different ids (the second and later run a cached plan).
    for ids in ([7, 2, 11], [0, 5], [3, 3, 9, 100], list(range(12))):
        res = ctx.sql(f"SELECT _id, label FROM t WHERE _id IN ({', '.join(map(str, ids))})")
        want = sorted({i for i in ids if i < 12})
        assert res.columns == ["_id", "label"]
        t = res.to_arrow()
        assert t.column("_id").to_pylist() == want
        assert t.column("label").to_pylist() == labels[want].tolist()
        assert "ZrecordScanExec" in res.explain()
    # Not lifted: NOT IN, negative literals, strings (answers as DataFusion plans them).
    assert ctx.sql("SELECT _id FROM t WHERE _id NOT IN (0, 1, 2, 3, 4, 5, 6, 7, 8)").to_arrow().column("_id").to_pylist() == [9, 10, 11]
    assert sorted(ctx.sql("SELECT _id FROM t WHERE _id IN (-1, 4)").to_arrow().column("_id").to_pylist()) == [4]
    # A table replaced under the same name: the next query reads the new one.
    other = tmp_path / "other"
    with zrecord.DenseWriter(other / "label", np.int64, (), "raw") as w:
        w.append(np.arange(20, dtype=np.int64) * 10)
    ctx.deregister("t")
    ctx.register("t", other)
    assert ctx.sql("SELECT label FROM t WHERE _id IN (15, 2)").to_arrow().column("label").to_pylist() == [20, 150]
    ctx.sql("DROP TABLE t")
    ctx.sql(f"CREATE EXTERNAL TABLE t STORED AS ZRECORD LOCATION '{path}'")
    assert ctx.sql("SELECT label FROM t WHERE _id IN (11, 2)").to_arrow().column("label").to_pylist() == labels[[2, 11]].tolist()

"""Progress feedback: tqdm bars on stderr for long verify / write / COPY / convert / train_dict,
shown at once with progress=True, after the delay with progress=None, never with False or
ZRECORD_PROGRESS=0."""

import numpy as np
import pyarrow as pa
import pytest

import zrecord
import zrecord._progress

pytest.importorskip("tqdm")

N = 500


@pytest.fixture()
def table():
    return pa.table({"x": np.arange(N, dtype=np.int64), "y": np.arange(N, dtype=np.float32) / 2})


def test_write_and_verify_show_bars(tmp_path, table, capsys):
    assert zrecord.write_dataset(table, tmp_path / "root", progress=True) == N
    err = capsys.readouterr().err
    assert "write" in err and "100%" in err and f"{N}/{N}" in err
    s = zrecord.Dataset(tmp_path / "root")["x"]
    assert s.verify(progress=True) == N
    err = capsys.readouterr().err
    assert "verify" in err and "100%" in err
    assert s.verify(progress=False) == N
    assert capsys.readouterr().err == ""


def test_default_shows_only_long_calls(tmp_path, table, capsys, monkeypatch):
    # The default (None) waits DELAY_SECONDS before drawing: a short call prints nothing ...
    zrecord.write_dataset(table, tmp_path / "a")
    assert capsys.readouterr().err == ""
    # ... and so does a small one even when it is slow: below MIN_BYTES no bar is set up ...
    monkeypatch.setattr(zrecord._progress, "DELAY_SECONDS", 0)
    zrecord.write_dataset(table, tmp_path / "b0")
    assert capsys.readouterr().err == ""
    # ... while a large call that outlasts the delay draws it (zero delay and threshold stand in
    # for a long write of a large table).
    monkeypatch.setattr(zrecord._progress, "MIN_BYTES", 0)
    zrecord.write_dataset(table, tmp_path / "b")
    assert "write" in capsys.readouterr().err
    # ZRECORD_PROGRESS=0 turns the default off.
    monkeypatch.setenv("ZRECORD_PROGRESS", "0")
    zrecord.write_dataset(table, tmp_path / "c")
    assert capsys.readouterr().err == ""


def test_copy_and_train_dict_and_convert(tmp_path, table, capsys):
    ctx = zrecord.SessionContext()
    ctx.register_arrow("t", table)
    out = pa.table(ctx.sql(f"COPY t TO '{tmp_path / 'copy'}' STORED AS ZRECORD", progress=True))
    assert out.column(0).to_pylist() == [N]
    err = capsys.readouterr().err
    assert "COPY" in err and f"{N}" in err
    samples = [np.full(64, i % 7, dtype=np.uint8).tobytes() + bytes([i % 251]) * 64 for i in range(200)]
    assert len(zrecord.train_dict(samples, 1024, progress=True)) > 0
    assert "train_dict" in capsys.readouterr().err
    # The default (progress=None): no bar for a conversion that ends within 2 s.
    zrecord.convert(table, tmp_path / "quiet", codec="raw")
    assert "convert" not in capsys.readouterr().err
    zrecord.convert(table, tmp_path / "conv", codec="raw", progress=True)
    err = capsys.readouterr().err
    assert "convert" in err and "100%" in err
    assert zrecord.Dataset(tmp_path / "conv").streams == ["x", "y"]


def test_writer_append_progress_counts_records(tmp_path, capsys):
    data = np.arange(300_000 * 8, dtype=np.float32).reshape(300_000, 8)
    with zrecord.DenseWriter(tmp_path / "d.zrec", "float32", (8,), "zstd") as w:
        w.append(data, progress=True)
        w.append(data[:10])  # small: no bar
    err = capsys.readouterr().err
    # One bar (redrawn in place, one final line): the small append drew none.
    assert err.count("\n") == 1 and "append" in err and "100%" in err and "300k/300k" in err
    view = zrecord.open(tmp_path / "d.zrec").bind(zrecord.Allocator())
    np.testing.assert_array_equal(np.from_dlpack(view[[0, 299_999, 300_009]]), data[[0, 299_999, 9]])
    recs = [np.arange(i % 5 + 1, dtype=np.int32) for i in range(1000)]
    with zrecord.RaggedWriter(tmp_path / "r.zrec", "int32", 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(recs), progress=True)
    assert "append" in capsys.readouterr().err
    assert len(zrecord.open(tmp_path / "r.zrec")) == 1000

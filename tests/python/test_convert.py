"""zrecord.convert: Hugging Face datasets (mapped order, features, images), Arrow sources,
files and the CLI; every type rule and error; atomic publish."""

import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import zrecord
from _servers import zrec_bin

datasets = pytest.importorskip("datasets")
PIL = pytest.importorskip("PIL.Image")

from datasets import Array2D, Array3D, ClassLabel, Dataset, Features, Image, Value  # noqa: E402

try:  # datasets >= 4
    from datasets import List  # noqa: E402
except ImportError:  # the oldest supported (2.14): a list feature is a Sequence
    from datasets import Sequence as List  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def read_root(root):
    """Every stream of a dataset root as NumPy (dense: one array; ragged: a list of arrays;
    utf8: a list of str), read through the store API."""
    meta = json.loads((Path(root) / "dataset.json").read_text())
    out = {}
    with zrecord.Allocator("cpu", pool_size_bytes=64 << 20) as alloc:
        for s in meta["streams"]:
            store = zrecord.open(Path(root) / s["path"])
            view = store.bind(alloc)
            ids = list(range(len(view)))
            if isinstance(store, zrecord.DenseStore):
                out[s["name"]] = np.from_dlpack(view[ids]).copy() if ids else np.empty((0,))
            else:
                recs = [np.from_dlpack(t).copy() for t in view.gather(ids).to_tensors()] if ids else []
                if s["logical"] == "utf8":
                    recs = [r.tobytes().decode() for r in recs]
                out[s["name"]] = recs
    return meta, out


def png_bytes(arr, fmt="PNG", **kw):
    buf = io.BytesIO()
    PIL.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


def make_hf(n=40, seed=0):
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        h, w = 4 + i % 5, 3 + i % 7
        if i % 3 == 0:
            images.append({"bytes": png_bytes(rng.integers(0, 255, (h, w), dtype=np.uint8)), "path": None})
        else:
            images.append({"bytes": png_bytes(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)), "path": None})
    data = {
        "tokens": [list(range(i, i + 1 + i % 9)) for i in range(n)],
        "label": [i % 3 for i in range(n)],
        "text": [f"doc {i} " + "x" * (i % 5) for i in range(n)],
        "mat": [np.full((2, 3), i, dtype=np.float32) for i in range(n)],
        "vol": [np.full((1 + i % 3, 2, 2), i, dtype=np.int16) for i in range(n)],
        "img": images,
    }
    features = Features(
        {
            "tokens": List(Value("int32")),
            "label": ClassLabel(names=["a", "b", "c"]),
            "text": Value("string"),
            "mat": Array2D((2, 3), "float32"),
            "vol": Array3D((None, 2, 2), "int16"),
            "img": Image(),
        }
    )
    return Dataset.from_dict(data, features=features)


def check_against(ds, got):
    """Every stream equals the HF dataset's rows, in the dataset's (mapped) order."""
    rows = ds.with_format("numpy", columns=["tokens", "label", "mat", "vol"])
    assert len(got["label"]) == len(ds)
    for i in range(len(ds)):
        r = rows[i]
        np.testing.assert_array_equal(got["tokens"][i], r["tokens"])
        assert got["label"][i] == r["label"]
        np.testing.assert_array_equal(got["mat"][i], r["mat"])
        np.testing.assert_array_equal(got["vol"][i], r["vol"])
    assert got["text"] == ds["text"]


def test_hf_dataset_round_trip_in_mapped_order_with_images_and_features(tmp_path):
    ds = make_hf()
    mapped = ds.shuffle(seed=3).filter(lambda r: r["label"] != 1).select(range(0, 20, 2))
    assert mapped._indices is not None
    report = zrecord.convert(mapped, tmp_path / "root", decode_images="HWC", progress=False, batch_rows=3)
    assert report["rows"] == len(mapped) == 10
    meta, got = read_root(tmp_path / "root")
    check_against(mapped, got)
    # Images: decoded pixels equal Pillow's (grey images get a channel axis of 1).
    for i, rec in enumerate(got["img"]):
        ref = np.asarray(PIL.open(io.BytesIO(mapped.data.table.column("img")[mapped._indices.column(0)[i].as_py()]["bytes"].as_py())))
        np.testing.assert_array_equal(rec, ref.reshape(ref.shape[0], ref.shape[1], -1))
    hf = meta["metadata"]["huggingface"]
    assert hf["class_labels"] == {"label": ["a", "b", "c"]}
    assert hf["features"]["mat"]["_type"] == "Array2D"
    assert meta["metadata"]["source"]["kind"] == "huggingface"
    kinds = dict((n, lay) for n, lay, _ in report["streams"])
    assert kinds["mat"] == "float32 dense [2, 3]"
    assert kinds["vol"].endswith("ragged ndim 3")


def test_every_split_helper_keeps_order_train_test_split_and_select(tmp_path):
    ds = make_hf(60).remove_columns(["img"])
    split = ds.train_test_split(test_size=0.25, seed=1)
    for name in ("train", "test"):
        part = split[name]
        zrecord.convert(part, tmp_path / name, progress=False, batch_rows=7)
        check_against(part, read_root(tmp_path / name)[1])
    picked = ds.select([5, 5, 0, 59])  # repeats and arbitrary order
    zrecord.convert(picked, tmp_path / "picked", progress=False, columns=["label", "tokens"])
    meta, got = read_root(tmp_path / "picked")
    assert [s["name"] for s in meta["streams"]] == ["label", "tokens"]
    assert got["label"].tolist() == [5 % 3, 5 % 3, 0, 59 % 3]
    np.testing.assert_array_equal(got["tokens"][3], np.arange(59, 59 + 1 + 59 % 9))


def test_public_api_fallback_when_the_private_indices_mapping_changes(tmp_path, monkeypatch):
    """`convert` reads `datasets.Dataset._indices` for speed; a `datasets` version that keeps it
    another way takes the public path (with_format("arrow").iter) with the same result."""
    import sys

    zc = sys.modules["zrecord.convert"]  # the module (zrecord.convert is also the function)
    ds = make_hf(50).remove_columns(["img"]).shuffle(seed=3).filter(lambda r: r["label"] != 1).select(range(20, 2, -3))
    zrecord.convert(ds, tmp_path / "fast", progress=False, batch_rows=4)
    monkeypatch.setattr(zc, "_private_indices", lambda d: zc._UNKNOWN)
    zrecord.convert(ds, tmp_path / "public", progress=False, batch_rows=4, columns=["tokens", "label"])
    _, fast = read_root(tmp_path / "fast")
    meta, public = read_root(tmp_path / "public")
    check_against(ds, fast)
    assert [s["name"] for s in meta["streams"]] == ["tokens", "label"]
    assert public["label"].tolist() == fast["label"].tolist() == ds["label"]
    assert [t.tolist() for t in public["tokens"]] == [t.tolist() for t in fast["tokens"]]
    # An indices object of an unexpected shape is treated as unknown, not misread.
    class Odd:
        table = pa.table({"a": [1], "b": [2]})
    monkeypatch.undo()
    assert zc._private_indices(type("D", (), {"_indices": Odd()})()) is zc._UNKNOWN


def test_images_resized_chw_dense_and_jpeg_close_to_pillow(tmp_path):
    smooth = [np.clip(np.add.outer(np.arange(16), np.arange(12))[..., None] * 6 + k * 9 + np.array([0, 40, 80]), 0, 255).astype(np.uint8) for k in range(6)]
    ds = Dataset.from_dict(
        {"img": [{"bytes": png_bytes(a, "JPEG", quality=95), "path": None} for a in smooth], "y": list(range(6))},
        features=Features({"img": Image(), "y": Value("int64")}),
    )
    zrecord.convert(ds, tmp_path / "jpg", decode_images="HWC", progress=False)
    _, got = read_root(tmp_path / "jpg")
    for rec, row in zip(got["img"], ds):
        ref = np.asarray(row["img"].convert("RGB"))
        assert rec.shape == ref.shape
        # JPEG decoders may round chroma upsampling differently by a unit or two.
        assert np.abs(rec.astype(int) - ref.astype(int)).max() <= 3
    zrecord.convert(ds, tmp_path / "small", decode_images="CHW", image_mode="L", resize=(8, 6), progress=False)
    _, got = read_root(tmp_path / "small")
    assert got["img"].shape == (6, 1, 8, 6)
    assert got["img"].dtype == np.uint8


def _pillow_sources(rng):
    """PNG images of every pixel format Pillow writes: L, LA, RGB, RGBA, palette (with and
    without transparency) and 16-bit grey (values above 255 included), as (name, bytes)."""
    h, w = 7, 5
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    out = [
        ("L", png_bytes(rng.integers(0, 256, (h, w), dtype=np.uint8))),
        ("LA", png_bytes(rng.integers(0, 256, (h, w, 2), dtype=np.uint8))),
        ("RGB", png_bytes(rgb)),
        ("RGBA", png_bytes(rng.integers(0, 256, (h, w, 4), dtype=np.uint8))),
        # Saturated primaries and greys, where Rec.709 and ITU-R 601-2 differ most.
        ("RGB-primaries", png_bytes(np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [200, 30, 90], [17, 240, 3]]] * 3, dtype=np.uint8))),
    ]
    pal = PIL.fromarray(rgb).quantize(colors=16)
    buf = io.BytesIO()
    pal.save(buf, format="PNG")
    out.append(("P", buf.getvalue()))
    buf = io.BytesIO()
    pal.save(buf, format="PNG", transparency=3)
    out.append(("P-transparent", buf.getvalue()))
    grey16 = PIL.fromarray(rng.integers(0, 1024, (h, w), dtype=np.uint16))
    buf = io.BytesIO()
    grey16.save(buf, format="PNG")
    out.append(("I;16", buf.getvalue()))
    return out


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA"])
def test_image_mode_equals_pillow_convert_for_png(tmp_path, mode):
    sources = _pillow_sources(np.random.default_rng(7))
    ds = Dataset.from_dict(
        {"img": [{"bytes": b, "path": None} for _, b in sources]},
        features=Features({"img": Image()}),
    )
    zrecord.convert(ds, tmp_path / "r", decode_images="HWC", image_mode=mode, progress=False)
    _, got = read_root(tmp_path / "r")
    for (name, b), rec in zip(sources, got["img"]):
        ref = np.asarray(PIL.open(io.BytesIO(b)).convert(mode))
        ref = ref.reshape(ref.shape[0], ref.shape[1], -1)
        assert rec.shape == ref.shape, (name, mode)
        np.testing.assert_array_equal(rec, ref, err_msg=f"{name} -> {mode}")
    # Grey is ITU-R 601-2 (Pillow), not Rec.709: pure red is 76, not 54.
    if mode == "L":
        assert got["img"][4][0, 0, 0] == 76


def test_image_mode_jpeg_within_stated_tolerance_of_pillow(tmp_path):
    rng = np.random.default_rng(3)
    smooth = [np.clip(np.add.outer(np.arange(24), np.arange(16))[..., None] * 5 + k * 11 + np.array([0, 60, 120]), 0, 255).astype(np.uint8) for k in range(4)]
    smooth.append(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    jpgs = [png_bytes(a, "JPEG", quality=90) for a in smooth]
    ds = Dataset.from_dict({"img": [{"bytes": b, "path": None} for b in jpgs]}, features=Features({"img": Image()}))
    for mode in ("L", "RGB"):
        zrecord.convert(ds, tmp_path / mode, decode_images="HWC", image_mode=mode, progress=False)
        _, got = read_root(tmp_path / mode)
        for b, rec in zip(jpgs, got["img"]):
            ref = np.asarray(PIL.open(io.BytesIO(b)).convert(mode)).reshape(rec.shape)
            # The documented tolerance: two JPEG decoders (chroma upsampling, IDCT rounding).
            assert np.abs(rec.astype(int) - ref.astype(int)).max() <= 4, mode


def test_type_rules_and_errors_name_the_column_and_feature(tmp_path):
    ds = make_hf(5)
    with pytest.raises(ValueError, match=r"column 'img' \(HF feature Image\).*decode_images"):
        zrecord.convert(ds, tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()
    nested = Dataset.from_dict({"x": [[[1], [2, 3]]]}, features=Features({"x": List(List(Value("int32")))}))
    with pytest.raises(ValueError, match="nested variable-length lists"):
        zrecord.convert(nested, tmp_path / "b", progress=False)
    with_null = Dataset.from_dict({"v": [1, None, 3]}, features=Features({"v": Value("int32")}))
    with pytest.raises(ValueError, match="column 'v' has a null at row 1"):
        zrecord.convert(with_null, tmp_path / "c", progress=False)
    empty = Dataset.from_dict({"t": [[1], []]}, features=Features({"t": List(Value("int32"))}))
    with pytest.raises(ValueError, match="row 1 is empty"):
        zrecord.convert(empty, tmp_path / "d", progress=False)
    zrecord.convert(empty, tmp_path / "d", progress=False, allow_empty=True)
    assert [r.tolist() for r in read_root(tmp_path / "d")[1]["t"]] == [[1], []]
    with pytest.raises(TypeError, match=r"DatasetDict.*ds\['train'\]"):
        zrecord.convert(datasets.DatasetDict({"train": empty, "test": empty}), tmp_path / "e")
    it = empty.to_iterable_dataset()
    with pytest.raises(TypeError, match="from_generator"):
        zrecord.convert(it, tmp_path / "e")
    with pytest.raises(FileExistsError):
        zrecord.convert(empty, tmp_path / "d", progress=False, allow_empty=True)
    with pytest.raises(ValueError, match="no column 'nope'"):
        zrecord.convert(pa.table({"a": [1]}), tmp_path / "f", columns=["nope"], progress=False)
    with pytest.raises(TypeError, match="cannot convert"):
        zrecord.convert(object(), tmp_path / "g")
    # Binary and the plain {values, shape} struct.
    t = pa.table(
        {
            "raw": pa.array([b"\x00\x01", b"\xff"], pa.binary()),
            "t2": pa.array(
                [{"values": [1, 2, 3, 4, 5, 6], "shape": [2, 3]}, {"values": [7, 8], "shape": [1, 2]}],
                pa.struct([("values", pa.list_(pa.int16())), ("shape", pa.list_(pa.uint64(), 2))]),
            ),
        }
    )
    zrecord.convert(t, tmp_path / "h", progress=False)
    meta, got = read_root(tmp_path / "h")
    assert [s["logical"] for s in meta["streams"]] == ["binary", "tensor"]
    assert [bytes(r) for r in got["raw"]] == [b"\x00\x01", b"\xff"]
    np.testing.assert_array_equal(got["t2"][0], np.arange(1, 7, dtype=np.int16).reshape(2, 3))


def test_an_error_in_the_last_column_or_an_interrupt_publishes_nothing(tmp_path):
    n = 50
    ds = Dataset.from_dict(
        {"a": list(range(n)), "b": [1] * (n - 1) + [None]}, features=Features({"a": Value("int64"), "b": Value("int64")})
    )
    with pytest.raises(ValueError, match="column 'b' has a null at row 49"):
        zrecord.convert(ds, tmp_path / "x", batch_rows=10, progress=False)
    assert not (tmp_path / "x").exists()
    assert os.listdir(tmp_path) == []

    def interrupt(rows, nbytes):
        if rows >= 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        zrecord.convert(make_hf(40).remove_columns(["img"]), tmp_path / "y", batch_rows=10, progress=interrupt)
    assert os.listdir(tmp_path) == []


def test_arrow_sources_polars_and_progress(tmp_path):
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"x": [1.5, 2.5, 3.5], "s": ["a", "bb", "ccc"], "l": [[1, 2], [3], [4, 5, 6]]})
    seen = []
    zrecord.convert(df, tmp_path / "pl", progress=lambda r, b: seen.append(r))
    _, got = read_root(tmp_path / "pl")
    assert got["x"].tolist() == [1.5, 2.5, 3.5] and got["s"] == ["a", "bb", "ccc"]
    assert seen[-1] == 3
    reader = pa.table({"v": pa.array(np.arange(100, dtype=np.uint16))}).to_reader(max_chunksize=7)
    zrecord.convert(reader, tmp_path / "rd", progress=False, train_dict=True, dict_bytes=1024)
    assert read_root(tmp_path / "rd")[1]["v"].tolist() == list(range(100))
    import pyarrow.dataset as pads

    pq.write_table(pa.table({"k": list(range(30)), "z": [str(i) for i in range(30)]}), tmp_path / "p.parquet")
    zrecord.convert(pads.dataset(tmp_path / "p.parquet"), tmp_path / "pads", columns=["z"], progress=False)
    assert read_root(tmp_path / "pads")[1]["z"] == [str(i) for i in range(30)]


def test_files_and_cli_parquet_csv_and_save_to_disk(tmp_path):
    ds = make_hf(30).remove_columns(["img"])
    ds.to_parquet(str(tmp_path / "d.parquet"))
    report = zrecord.convert(str(tmp_path / "d.parquet"), tmp_path / "from_pq", progress=False)
    assert report["rows"] == 30
    check_against(ds, read_root(tmp_path / "from_pq")[1])
    ds.to_csv(str(tmp_path / "d.csv"), columns=["label", "text"], index=False)
    saved = make_hf(12).shuffle(seed=5)
    saved.save_to_disk(str(tmp_path / "saved"))
    zrec = zrec_bin()
    for src, dst, extra in [
        (tmp_path / "d.parquet", "cli_pq", []),
        (tmp_path / "d.csv", "cli_csv", []),
        (tmp_path / "saved", "cli_saved", ["--decode-images", "HWC"]),
    ]:
        out = subprocess.run([zrec, "convert", str(src), str(tmp_path / dst), "--quiet", *extra], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "converted" in out.stdout
    check_against(ds, read_root(tmp_path / "cli_pq")[1])
    _, got = read_root(tmp_path / "cli_csv")
    assert got["label"].tolist() == ds["label"] and got["text"] == ds["text"]
    meta, got = read_root(tmp_path / "cli_saved")
    check_against(saved, got)
    assert meta["metadata"]["huggingface"]["class_labels"]["label"] == ["a", "b", "c"]
    for i, rec in enumerate(got["img"]):
        ref = np.asarray(saved[i]["img"])
        np.testing.assert_array_equal(rec, ref.reshape(ref.shape[0], ref.shape[1], -1))
    # A DatasetDict folder is refused with the split names.
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    out = subprocess.run([zrec, "convert", str(tmp_path / "dd"), str(tmp_path / "nope"), "--quiet"], capture_output=True, text=True)
    assert out.returncode == 1 and "DatasetDict" in out.stderr
    assert not (tmp_path / "nope").exists()


def test_cli_ctrl_c_publishes_nothing_and_removes_staging(tmp_path):
    import signal
    import time

    import pyarrow.csv as pacsv

    zrec = zrec_bin()
    n = 3_000_000
    pacsv.write_csv(pa.table({"a": np.arange(n), "s": pa.array(np.arange(n).astype(str))}), tmp_path / "big.csv")
    out = tmp_path / "out"
    p = subprocess.Popen([zrec, "convert", str(tmp_path / "big.csv"), str(out), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Interrupt once the staging folder exists: the conversion is under way.
    deadline = time.time() + 60
    while time.time() < deadline and not any(e.startswith(".out.zrecord-tmp-") for e in os.listdir(tmp_path)):
        assert p.poll() is None, "finished before it could be interrupted"
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert "interrupted" in err
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["big.csv"]


def test_write_dataset_and_convert_share_their_defaults(tmp_path):
    import inspect

    t = pa.table({"x": np.arange(10, dtype=np.int64), "s": ["a", "bb"] * 5})
    assert zrecord.write_dataset(t, tmp_path / "a") == 10
    assert zrecord.convert(t, tmp_path / "b")["rows"] == 10
    for root in ("a", "b"):
        assert [zrecord.open(tmp_path / root / f).codec for f in ("000-x", "001-s")] == ["zstd", "zstd"]
    w = inspect.signature(zrecord.write_dataset).parameters
    c = inspect.signature(zrecord.convert).parameters
    for name in ("codec", "level", "data_shards", "allow_empty", "progress"):
        assert w[name].default == c[name].default, name
    with zrecord.DatasetWriter(tmp_path / "c") as dw:
        dw.write(t)
    assert zrecord.open(tmp_path / "c" / "000-x").codec == "zstd"

"""zrecord.zarr against zarr-python 3's own reads: every layout, codec, dtype, key encoding,
fill value and edge case, plus the pipeline's streaming, errors and memory budget."""

from __future__ import annotations

import json
import math
import os
import threading
import time

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec  # noqa: E402

from _servers import RangeServer  # noqa: E402
import zrecord  # noqa: E402
import zrecord.zarr as zz  # noqa: E402

RNG = np.random.default_rng(7)


def _data(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return RNG.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -50000), min(info.max, 50000), shape, endpoint=True).astype(dtype)


def _v3(path, data, chunks, **kw):
    kw.setdefault("fill_value", 0)
    z = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, zarr_format=3, **kw)
    z[...] = data
    return z


def _v2(path, data, chunks, **kw):
    kw.setdefault("fill_value", 0)
    z = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, zarr_format=2, **kw)
    z[...] = data
    return z


def _crop_ref(ref, aabb, fill):
    """The crop with out-of-bounds parts filled, from a NumPy reference."""
    out = np.full([b - a for a, b in aabb], fill, dtype=ref.dtype)
    src, dst = [], []
    for (a, b), n in zip(aabb, ref.shape):
        lo, hi = max(a, 0), min(b, n)
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - a, hi - a))
    out[tuple(dst)] = ref[tuple(src)]
    return out


LAYOUTS = {
    "v3-bytes": lambda p, d: _v3(p, d, (4, 5, 6), compressors=None),
    "v3-bytes-big": lambda p, d: _v3(p, d, (4, 5, 6), serializer=BytesCodec(endian="big"), compressors=None),
    "v3-zstd": lambda p, d: _v3(p, d, (4, 5, 6), compressors=[ZstdCodec(level=3)]),
    "v3-gzip-crc": lambda p, d: _v3(p, d, (3, 7, 4), compressors=[GzipCodec(level=5), Crc32cCodec()]),
    "v3-blosc-zstd-shuffle": lambda p, d: _v3(p, d, (4, 5, 6), compressors=[BloscCodec(cname="zstd", shuffle="shuffle")]),
    "v3-blosc-lz4-bitshuffle": lambda p, d: _v3(p, d, (4, 5, 6), compressors=[BloscCodec(cname="lz4", shuffle="bitshuffle")]),
    "v3-blosc-lz4hc-noshuffle": lambda p, d: _v3(p, d, (4, 5, 6), compressors=[BloscCodec(cname="lz4hc", shuffle="noshuffle")]),
    "v3-blosc-zlib": lambda p, d: _v3(p, d, (4, 5, 6), compressors=[BloscCodec(cname="zlib", shuffle="shuffle")]),
    "v3-blosc-blosclz": lambda p, d: _v3(p, d, (4, 5, 6), compressors=[BloscCodec(cname="blosclz", shuffle="shuffle")]),
    "v3-transpose": lambda p, d: _v3(p, d, (4, 5, 6), filters=[TransposeCodec(order=(2, 0, 1))], compressors=[ZstdCodec(level=1)]),
    "v3-key-dot": lambda p, d: _v3(p, d, (4, 5, 6), chunk_key_encoding={"name": "default", "separator": "."}, compressors=None),
    "v3-key-v2-slash": lambda p, d: _v3(p, d, (4, 5, 6), chunk_key_encoding={"name": "v2", "separator": "/"}, compressors=None),
    "v3-key-v2-dot": lambda p, d: _v3(p, d, (4, 5, 6), chunk_key_encoding={"name": "v2", "separator": "."}, compressors=[ZstdCodec(level=1)]),
    "v3-sharded-end": lambda p, d: _v3(p, d, (2, 5, 3), shards=(4, 10, 6), compressors=[ZstdCodec(level=3)]),
    "v3-sharded-start": lambda p, d: _v3(
        p, d, (4, 10, 6), serializer=ShardingCodec(chunk_shape=(2, 5, 3), codecs=[BytesCodec(), ZstdCodec(level=3)], index_location="start"), compressors=None
    ),
    "v3-sharded-blosc": lambda p, d: _v3(p, d, (2, 5, 3), shards=(4, 10, 6), compressors=[BloscCodec(cname="zstd", shuffle="bitshuffle")]),
    "v2-none-C": lambda p, d: _v2(p, d, (4, 5, 6), compressors=None),
    "v2-zstd-F": lambda p, d: _v2(p, d, (4, 5, 6), compressors=numcodecs.Zstd(level=3), order="F"),
    "v2-blosc-slash": lambda p, d: _v2(p, d, (4, 5, 6), compressors=numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE), chunk_key_encoding={"name": "v2", "separator": "/"}),
    "v2-blosc-F-bitshuffle": lambda p, d: _v2(p, d, (3, 7, 4), compressors=numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE), order="F"),
}

SHAPE = (9, 17, 13)  # edge chunks on every axis
CROPS = [
    [(0, 4), (0, 5), (0, 6)],  # one chunk
    [(2, 7), (3, 13), (5, 12)],  # crosses chunk and shard borders
    [(5, 9), (10, 17), (7, 13)],  # edge chunks
    [(-2, 3), (15, 20), (-1, 5)],  # out of bounds on both sides
    [(20, 23), (0, 5), (0, 6)],  # entirely outside
]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_read_like_zarr(tmp_path, layout):
    data = _data(SHAPE, "uint16")
    z = LAYOUTS[layout](tmp_path / "a.zarr", data)
    uri = str(tmp_path / "a.zarr")
    ref = z[...]
    np.testing.assert_array_equal(ref, data)
    whole = np.from_dlpack(zz.read(uri))
    assert whole.dtype == np.uint16 and whole.shape == SHAPE
    np.testing.assert_array_equal(whole, ref)
    for aabb in CROPS:
        got = np.from_dlpack(zz.gather([zz.Sample(uri, aabb)]))[0]
        np.testing.assert_array_equal(got, _crop_ref(ref, aabb, 0), err_msg=f"{layout} {aabb}")


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "complex64"])
@pytest.mark.parametrize("fmt", [2, 3])
def test_dtypes(tmp_path, dtype, fmt):
    data = _data((7, 9), dtype) if dtype != "complex64" else (RNG.standard_normal((7, 9)) + 1j * RNG.standard_normal((7, 9))).astype("complex64")
    if fmt == 3:
        z = _v3(tmp_path / "a", data, (3, 4), compressors=[ZstdCodec(level=1)], fill_value=0)
    else:
        z = _v2(tmp_path / "a", data, (3, 4), compressors=numcodecs.Zstd(level=1), fill_value=0)
    got = np.from_dlpack(zz.read(str(tmp_path / "a")))
    assert got.dtype == data.dtype
    np.testing.assert_array_equal(got, z[...])


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), -float("inf"), 2.5])
@pytest.mark.parametrize("layout", ["chunked", "sharded", "v2"])
def test_missing_chunks_and_shards_read_as_fill(tmp_path, fill, layout):
    shape = (8, 12)
    p = str(tmp_path / "a")
    if layout == "chunked":
        z = zarr.create_array(store=p, shape=shape, chunks=(4, 4), dtype="float32", fill_value=fill, compressors=[ZstdCodec(level=1)])
    elif layout == "sharded":
        z = zarr.create_array(store=p, shape=shape, chunks=(2, 2), shards=(4, 4), dtype="float32", fill_value=fill, compressors=[ZstdCodec(level=1)])
    else:
        z = zarr.create_array(store=p, shape=shape, chunks=(4, 4), dtype="float32", fill_value=fill, zarr_format=2, compressors=numcodecs.Zstd(level=1))
    z[0:2, 0:3] = 1.0  # one (inner) chunk partly written; the rest never stored
    z[5, 9] = 7.0
    ref = z[...]
    got = np.from_dlpack(zz.read(p))
    np.testing.assert_array_equal(got, ref)  # NaN-aware equality
    crop = np.from_dlpack(zz.gather([zz.Sample(p, [(-1, 6), (8, 14)])]))[0]
    np.testing.assert_array_equal(crop, _crop_ref(ref, [(-1, 6), (8, 14)], np.float32(fill)))
    if layout == "sharded":
        # empty inner entries inside a present shard, and absent shards
        present = sorted(os.listdir(os.path.join(p, "c", "0")))
        assert present  # shard (0, *) exists
        assert not os.path.exists(os.path.join(p, "c", "1", "0"))


def test_index_queries_equal_numpy_fancy_indexing(tmp_path):
    data = _data((20, 30, 11), "int32")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 6, 5), shards=(8, 12, 10), compressors=[ZstdCodec(level=1)])
    sels = [
        ([7, 2, 7], slice(16, 28), [10, 3, 0, 3]),
        ([-1, 0], slice(None, None, 3), slice(-4, None)),
        (np.array([19, 19, 0]), [5], slice(10, 0, -2)),
        (5, slice(0, 30), np.arange(11)[::-1]),
    ]
    for sel in sels:
        q = zz.IndexQuery(p, sel)
        axes = []
        for s, n in zip(sel, data.shape):
            if isinstance(s, slice):
                axes.append(np.arange(n)[s])
            else:
                axes.append(np.atleast_1d(np.asarray(s)))
        ref = data[np.ix_(*axes)]
        got = np.from_dlpack(zz.gather([q]))[0]
        np.testing.assert_array_equal(got, ref, err_msg=str(sel))
        assert q.shape_in(data.shape) == ref.shape
    assert zz.IndexQuery(p, ([7, 2, 7], slice(16, 80), [100, 3, 40, 3])).shape == (3, 64, 4)
    # Open and negative slice ends resolve against the array's shape (read from its metadata).
    for sel in sels[1:]:
        assert zz.IndexQuery(p, sel).shape == zz.IndexQuery(p, sel).shape_in(data.shape)
    assert zz.IndexQuery(p, (slice(None), slice(-4, None), -1)).shape == (20, 4, 1)
    with pytest.raises((FileNotFoundError, ValueError)):
        zz.IndexQuery(str(tmp_path / "missing"), (slice(None),)).shape
    with pytest.raises(IndexError):
        zz.gather([zz.IndexQuery(p, ([20], slice(0, 2), [0]))])


def test_casts(tmp_path):
    data = _data((6, 8), "uint16")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 4), compressors=[ZstdCodec(level=1)])
    f32 = np.from_dlpack(zz.read(p, dtype="f32"))
    assert f32.dtype == np.float32
    np.testing.assert_array_equal(f32, data.astype(np.float32))
    f16 = np.from_dlpack(zz.read(p, dtype="f16"))
    np.testing.assert_array_equal(f16, data.astype(np.float16))
    i64 = np.from_dlpack(zz.read(p, dtype="int64"))
    np.testing.assert_array_equal(i64, data.astype(np.int64))
    with pytest.raises(ValueError, match="cannot cast uint16 to int16"):
        zz.read(p, dtype="int16")
    torch = pytest.importorskip("torch")
    bf = torch.from_dlpack(zz.read(p, dtype="bf16"))
    assert bf.dtype == torch.bfloat16
    assert torch.equal(bf, torch.from_numpy(data.astype(np.float32)).to(torch.bfloat16))


def test_ngff_levels(tmp_path):
    root = tmp_path / "img.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    full = _data((8, 16, 16), "uint8")
    half = full[:, ::2, ::2].copy()
    for name, arr in (("s0", full), ("s1", half)):
        a = g.create_array(name, shape=arr.shape, chunks=(4, 8, 8), dtype=arr.dtype, compressors=[ZstdCodec(level=1)])
        a[...] = arr
    g.attrs["ome"] = {"version": "0.5", "multiscales": [{"axes": [{"name": n} for n in "zyx"], "datasets": [{"path": "s0"}, {"path": "s1"}]}]}
    np.testing.assert_array_equal(np.from_dlpack(zz.read(str(root))), full)
    np.testing.assert_array_equal(np.from_dlpack(zz.read(str(root), level=1)), half)
    got = np.from_dlpack(zz.gather([zz.Sample(str(root), [(0, 4), (2, 6), (2, 6)], level=1)]))[0]
    np.testing.assert_array_equal(got, half[0:4, 2:6, 2:6])
    with pytest.raises(ValueError, match="level 2 is out of range"):
        zz.read(str(root), level=2)
    # NGFF 0.4 on Zarr v2: multiscales at the top level of .zattrs
    root2 = tmp_path / "img2.zarr"
    g2 = zarr.open_group(str(root2), mode="w", zarr_format=2)
    a = g2.create_array("0", shape=full.shape, chunks=(4, 8, 8), dtype=full.dtype, compressors=None)
    a[...] = full
    g2.attrs["multiscales"] = [{"version": "0.4", "datasets": [{"path": "0"}]}]
    np.testing.assert_array_equal(np.from_dlpack(zz.read("file://" + str(root2))), full)


def test_info_and_file_uri(tmp_path):
    data = _data((9, 17, 13), "uint16")
    p = tmp_path / "a"
    _v3(p, data, (2, 5, 3), shards=(4, 10, 6), compressors=[ZstdCodec(level=1)])
    i = zz.info(p)
    assert i["shape"] == (9, 17, 13) and i["chunks"] == (2, 5, 3) and i["sharded"] and i["zarr_format"] == 3 and i["dtype"] == "uint16"
    np.testing.assert_array_equal(np.from_dlpack(zz.read("file://" + str(p))), data)


def test_errors_name_the_field(tmp_path):
    data = _data((4, 4), "uint16")
    p = tmp_path / "a"
    _v3(p, data, (2, 2), compressors=[ZstdCodec(level=1)])
    meta = json.loads((p / "zarr.json").read_text())
    meta["codecs"].append({"name": "no_such_codec", "configuration": {}})
    (p / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="field 'codecs'.*no_such_codec"):
        zz.read(str(p))
    with pytest.raises(FileNotFoundError):
        zz.read(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="scheme 'ftp'"):
        zz.read("ftp://bucket/a.zarr")
    q = tmp_path / "b"
    _v3(q, data, (2, 2), compressors=None)
    meta = json.loads((q / "zarr.json").read_text())
    meta["chunk_grid"] = {"name": "rectilinear", "configuration": {}}
    (q / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="field 'chunk_grid'"):
        zz.read(str(q))


def _corrupt_index(p):
    """Flip a byte of the first shard's index (stored at the end: its crc32c then fails)."""
    shard = os.path.join(p, "c")
    while os.path.isdir(shard):
        shard = os.path.join(shard, "0")
    b = bytearray(open(shard, "rb").read())
    b[-6] ^= 0xFF
    open(shard, "wb").write(bytes(b))


def test_corrupt_shard_index_is_an_error_before_any_batch(tmp_path):
    data = _data((8, 8), "uint16")
    p = str(tmp_path / "a")
    _v3(p, data, (2, 2), shards=(4, 4), compressors=[ZstdCodec(level=1)])
    _corrupt_index(p)
    with pytest.raises(zrecord.CorruptStoreError, match="shard index"):
        zz.read(p)
    with zz.Pipeline(zz.BatchSpec(2, (2, 2), "uint16"), limits=zz.Limits(decode_workers=1, max_read_bytes=1 << 16, max_chunk_bytes=1 << 16, max_memory_bytes=1 << 20)) as pl:
        pl.push([zz.Sample(p, [(4, 6), (4, 6)]), zz.Sample(p, [(0, 2), (0, 2)])])
        with pytest.raises(zrecord.CorruptStoreError, match="sample 1"):
            pl.pop(timeout=30)
        with pytest.raises(zrecord.CorruptStoreError):  # sticky
            pl.pop(timeout=30)


SMALL = zz.Limits(decode_workers=2, max_read_bytes=1 << 20, max_chunk_bytes=1 << 20, max_memory_bytes=64 << 20)


def test_pipeline_batches_in_order_with_shared_chunks(tmp_path):
    data = _data((16, 32, 32), "uint16")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 8, 8), shards=(8, 16, 16), compressors=[ZstdCodec(level=3)])
    rng = np.random.default_rng(1)
    crops = [[(int(z), int(z) + 4), (int(y), int(y) + 8), (int(x), int(x) + 8)] for z, y, x in zip(rng.integers(0, 13, 24), rng.integers(0, 25, 24), rng.integers(0, 25, 24))]
    crops[3] = crops[2]  # a shared chunk set inside one batch
    with zz.Pipeline(zz.BatchSpec(samples=4, shape=(4, 8, 8), dtype="f32"), limits=SMALL, queues=zz.QueueLimits(lookahead_samples=8, prepared_batches=2)) as pl:
        pl.push(zz.Sample(p, c) for c in crops[:10])
        pl.push(crops_ := [zz.Sample(p, c) for c in crops[10:]])
        assert len(crops_) == 14
        seen = 0
        for b in pl.batches(6):
            with b:
                x = np.from_dlpack(b)
                assert x.shape == (4, 4, 8, 8) and x.dtype == np.float32
                for k in range(4):
                    np.testing.assert_array_equal(x[k], _crop_ref(data, crops[seen + k], 0).astype(np.float32))
                assert b.index == seen // 4
                seen += 4
                del x
        st = pl.stats()
        assert st["samples"] == 24 and st["batches"] == 6
        assert st["chunks_decoded"] > 0 and st["index_cache_hits"] > 0 and st["read_amplification"] > 0
        with pytest.raises(ValueError, match="no samples pending"):
            pl.pop(timeout=5)


def test_batch_spec_same_takes_the_source_type(tmp_path):
    """BatchSpec(dtype="same"): the pipeline's batches take the first pushed sample's array
    type, for lists and lazily pulled generators alike."""
    data = _data((8, 16, 16), "int16")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 8, 8), compressors=[ZstdCodec(level=1)])
    crops = [[(z, z + 4), (y, y + 8), (x, x + 8)] for z, y, x in [(0, 0, 0), (4, 8, 8), (2, 3, 5), (1, 7, 0)]]
    for push in (lambda pl: pl.push([zz.Sample(p, c) for c in crops]), lambda pl: pl.push(zz.Sample(p, c) for c in crops)):
        with zz.Pipeline(zz.BatchSpec(2, (4, 8, 8)), limits=SMALL) as pl:
            assert pl.dtype is None and pl.stats() == {}
            with pytest.raises(ValueError, match="no samples pending"):
                pl.pop(timeout=1)
            push(pl)
            assert pl.dtype == "int16"
            got = [np.from_dlpack(b).copy() for b in pl.batches(2)]
        assert all(g.dtype == np.int16 and g.shape == (2, 4, 8, 8) for g in got)
        for k, c in enumerate(crops):
            np.testing.assert_array_equal(got[k // 2][k % 2], _crop_ref(data, c, 0))
    with zz.Pipeline(zz.BatchSpec(2, (4, 8, 8)), limits=SMALL) as pl:
        pl.push([])
        pl.push(iter(()))
        assert pl.dtype is None
        with pytest.raises(TypeError, match="Sample or IndexQuery"):
            pl.push(iter([42]))
        with pytest.raises((FileNotFoundError, ValueError)):
            pl.push([zz.Sample(str(tmp_path / "missing"), crops[0])])


def test_each_chunk_read_once_per_batch(tmp_path):
    data = _data((8, 8), "uint8")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 4), compressors=None)
    r = zz._ZarrReader({"decode_workers": 1})
    r.gather([zz.Sample(p, [(0, 4), (0, 4)])._query()] * 8)
    st = r.stats()
    assert st["chunks_decoded"] == 1 and st["reads"] == 1


def test_adjacent_inner_chunks_merge_into_one_read(tmp_path):
    data = _data((4, 16), "uint8")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 4), shards=(4, 16), compressors=None)
    r = zz._ZarrReader({"decode_workers": 1})
    got = np.from_dlpack(r.gather([zz.Sample(p, [(0, 4), (0, 16)])._query()]))[0]
    np.testing.assert_array_equal(got, data)
    st = r.stats()
    assert st["chunks_decoded"] == 4
    assert st["reads"] == 2  # the shard index + one merged read of the four inner chunks
    r2 = zz._ZarrReader({"decode_workers": 1, "max_read_bytes": 16})
    r2.gather([zz.Sample(p, [(0, 4), (0, 16)])._query()])
    assert r2.stats()["reads"] == 5  # merging capped at one 16-byte chunk per read


def test_shard_reads_share_the_store_range_planner(tmp_path):
    # Inner chunks 0 and 2 of one shard (16 bytes each, chunk 1 between them unread): on a
    # local disk only touching ranges merge (index + 2 reads); over HTTP ranges closer than
    # the location's zrecord_coalesce_gap are one request (index + 1), as store preloads plan.
    data = _data((4, 16), "uint8")
    _v3(tmp_path / "a.zarr", data, (4, 4), shards=(4, 16), compressors=None)
    crops = [[(0, 4), (0, 4)], [(0, 4), (8, 12)]]

    def gather(uri):
        r = zz._ZarrReader({"decode_workers": 1})
        got = np.from_dlpack(r.gather([zz.Sample(uri, c)._query() for c in crops]))
        for k, c in enumerate(crops):
            np.testing.assert_array_equal(got[k], data[c[0][0]:c[0][1], c[1][0]:c[1][1]])
        return r.stats()["reads"]

    assert gather(str(tmp_path / "a.zarr")) == 3
    for gap, want_reads, want_bytes in [(None, 2, 48), (0, 3, 32)]:
        srv = RangeServer(tmp_path)
        try:
            if gap is not None:
                zrecord.set_storage_options(srv.url, {"zrecord_coalesce_gap": str(gap)})
            assert gather(f"{srv.url}/a.zarr") == want_reads
            bounded = [r for _, r in srv.requests if r and r[6:7].isdigit()]
            lengths = [int(b) - int(a) + 1 for a, b in (r[6:].split("-") for r in bounded)]
            assert sum(lengths) == want_bytes, srv.requests
        finally:
            srv.close()


def test_infinite_generator_and_early_close(tmp_path):
    data = _data((8, 64, 64), "uint16")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 16, 16), compressors=[ZstdCodec(level=1)])
    pulled = []

    def crops():
        rng = np.random.default_rng(0)
        while True:
            y, x = (int(v) for v in rng.integers(0, 48, 2))
            pulled.append((y, x))
            yield zz.Sample(p, [(0, 8), (y, y + 16), (x, x + 16)])

    pl = zz.Pipeline(zz.BatchSpec(4, (8, 16, 16), "uint16"), limits=SMALL, queues=zz.QueueLimits(lookahead_samples=4, prepared_batches=2))
    pl.push(crops())
    for i in range(3):
        with pl.pop(timeout=30) as b:
            x = b.numpy()
            y0, x0 = pulled[i * 4]
            np.testing.assert_array_equal(x[0], data[:, y0 : y0 + 16, x0 : x0 + 16])
            del x
    time.sleep(0.2)
    assert len(pulled) <= 4 * (3 + 2) + 4 + 4  # lazy: batches held + lookahead, not unbounded
    t0 = time.monotonic()
    pl.close()
    assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match="closed"):
        pl.pop(timeout=1)


def test_memory_budget_and_limits(tmp_path):
    with pytest.raises(MemoryError, match="pipeline budget"):
        zz.Pipeline(zz.BatchSpec(64, (16, 64, 64), "uint16"), limits=zz.Limits(decode_workers=1, max_memory_bytes=8 << 20))
    with pytest.raises(ValueError):
        zz.Pipeline(zz.BatchSpec(0, (4,), "uint8"))
    data = _data((8, 8), "uint8")
    p = str(tmp_path / "a")
    _v3(p, data, (8, 8), compressors=None)
    tiny = zz.Limits(decode_workers=1, max_read_bytes=1 << 10, max_chunk_bytes=32, max_memory_bytes=1 << 20)
    with zz.Pipeline(zz.BatchSpec(1, (8, 8), "uint8"), limits=tiny) as pl:
        pl.push([zz.Sample(p, [(0, 8), (0, 8)])])
        with pytest.raises(ValueError, match="max_chunk_bytes"):
            pl.pop(timeout=30)


def test_partial_tail_needs_finish_and_unreleased_slots_are_reported(tmp_path):
    data = _data((4, 4), "uint8")
    p = str(tmp_path / "a")
    _v3(p, data, (2, 2), compressors=None)
    s = zz.Sample(p, [(0, 2), (0, 2)])
    with zz.Pipeline(zz.BatchSpec(2, (2, 2), "uint8"), limits=SMALL, queues=zz.QueueLimits(prepared_batches=1)) as pl:
        pl.push([s, s, s, s])
        b = pl.pop(timeout=30)
        with pytest.raises(ValueError, match="slots are held"):
            pl.pop(timeout=30)
        b.release()
        with pytest.raises(ValueError, match="released"):
            np.from_dlpack(b)
        with pl.pop(timeout=30) as b2:
            assert b2.index == 1
        pl.push([s])
        with pytest.raises(ValueError, match="fewer than a batch"):
            pl.pop(timeout=30)
        pl.finish()
        with pl.pop(timeout=30) as last:
            assert last.shape == (1, 2, 2)
            np.testing.assert_array_equal(last.numpy()[0], data[:2, :2])
        with pytest.raises(ValueError, match="finished"):
            pl.push([s])


def test_sample_errors_name_sample_and_uri(tmp_path):
    data = _data((4, 4), "uint8")
    p = str(tmp_path / "a")
    _v3(p, data, (2, 2), compressors=None)
    with zz.Pipeline(zz.BatchSpec(2, (2, 2), "uint8"), limits=SMALL) as pl:
        pl.push([zz.Sample(p, [(0, 2), (0, 2)]), zz.Sample(str(tmp_path / "nope"), [(0, 2), (0, 2)])])
        with pytest.raises(FileNotFoundError, match=r"sample 1 .*nope"):
            pl.pop(timeout=30)
    with pytest.raises(TypeError):
        zz.Pipeline(zz.BatchSpec(1, (2, 2), "uint8")).push([object()])


def test_batch_arrow_export(tmp_path):
    pa = pytest.importorskip("pyarrow")
    data = _data((4, 6), "float32")
    p = str(tmp_path / "a")
    _v3(p, data, (2, 3), compressors=None)
    with zz.Pipeline(zz.BatchSpec(2, (2, 3), "float32"), limits=SMALL) as pl:
        pl.push([zz.Sample(p, [(0, 2), (0, 3)]), zz.Sample(p, [(2, 4), (3, 6)])])
        with pl.pop(timeout=30) as b:
            arr = pa.array(b)
            assert arr.type.extension_name == "arrow.fixed_shape_tensor"
            np.testing.assert_array_equal(arr.to_numpy_ndarray()[1], data[2:4, 3:6])


def test_crop_source_in_loader_and_sql(tmp_path):
    data = _data((8, 32, 32), "uint16")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 8, 8), shards=(8, 16, 16), compressors=[ZstdCodec(level=1)])
    crops = [[(0, 4), (i, i + 8), (2 * i, 2 * i + 8)] for i in range(10)]
    src = zz.CropSource(p, crops)
    assert len(src) == 10
    np.testing.assert_array_equal(np.from_dlpack(src[3]), data[0:4, 3:11, 6:14])
    sampler = zrecord.Sampler(10, 5, zrecord.Sampler.Mode.SEQUENTIAL)
    with zrecord.Loader({"crop": [src.bind(zrecord.Allocator())]}, sampler) as loader:
        got = [np.from_dlpack(parts[0]["crop"]).copy() for _, parts in zip(range(2), loader)]
    assert len(got) == 2 and got[1].shape == (5, 4, 8, 8)
    np.testing.assert_array_equal(got[1][2], data[0:4, 7:15, 14:22])
    rnd = zz.CropSource(p, shape=(4, 8, 8), count=100, seed=3)
    a, b = np.from_dlpack(rnd.gather([5, 5]))
    np.testing.assert_array_equal(a, b)
    ctx = zrecord.SessionContext()
    t = ctx.sql(f"SELECT _id, crop FROM zarr_crops('{p}', [4, 8, 8], 100, 3) WHERE _id IN (5, 7) ORDER BY _id").to_arrow()
    assert t.column("_id").to_pylist() == [5, 7]
    np.testing.assert_array_equal(t.column("crop").combine_chunks().to_numpy_ndarray()[0], a)
    with pytest.raises(ValueError, match="does not fit"):
        zz.CropSource(p, shape=(9, 8, 8), count=1)


def test_chunk_cache_serves_repeat_batches(tmp_path):
    data = _data((8, 16, 16), "uint16")
    p = str(tmp_path / "a")
    _v3(p, data, (4, 8, 8), shards=(8, 16, 16), compressors=[ZstdCodec(level=1)])
    r = zz.reader(limits=zz.Limits(decode_workers=2), cache=zz.CacheLimits(chunk_cache_bytes=1 << 20))
    crops = [zz.Sample(p, [(2, 6), (3, 11), (5, 13)]), zz.Sample(p, [(-1, 3), (12, 20), (0, 8)])]
    first = np.from_dlpack(r.gather(crops)).copy()
    decoded = r.stats()["chunks_decoded"]
    second = np.from_dlpack(r.gather(crops))
    np.testing.assert_array_equal(first, second)
    for k, c in enumerate(crops):
        np.testing.assert_array_equal(second[k], _crop_ref(data, c.aabb, 0))
    st = r.stats()
    assert st["chunks_decoded"] == decoded and st["chunk_cache_hits"] >= decoded
    with pytest.raises(MemoryError, match="chunk cache"):
        zz.Pipeline(zz.BatchSpec(1, (4,), "uint8"), limits=zz.Limits(decode_workers=1, max_read_bytes=1 << 10, max_chunk_bytes=1 << 10, max_memory_bytes=1 << 20), cache=zz.CacheLimits(chunk_cache_bytes=1 << 21))


def test_http_sources(tmp_path):
    sharded = _data((9, 17, 13), "uint16")
    _v3(tmp_path / "s.zarr", sharded, (2, 5, 3), shards=(4, 10, 6), compressors=[ZstdCodec(level=1)])
    chunked = _data((9, 17, 13), "float32")
    z = _v2(tmp_path / "c.zarr", chunked, (4, 5, 6), compressors=numcodecs.Blosc(cname="lz4"), fill_value=float("nan"))
    z[0:4, 0:5, 0:6] = float("nan")  # stored as all-NaN: zarr drops the chunk, a 404 reads as fill
    ref_c = z[...]
    srv = RangeServer(tmp_path)
    try:
        base = srv.url
        np.testing.assert_array_equal(np.from_dlpack(zz.read(f"{base}/s.zarr")), sharded)
        np.testing.assert_array_equal(np.from_dlpack(zz.read(f"{base}/c.zarr")), ref_c)
        aabb = [(-1, 5), (8, 14), (9, 15)]
        got = np.from_dlpack(zz.gather([zz.Sample(f"{base}/s.zarr", aabb)]))[0]
        np.testing.assert_array_equal(got, _crop_ref(sharded, aabb, 0))
        # the shard index came from a suffix range request, inner chunks from bounded ranges
        ranges = [r for _, r in srv.requests if r]
        assert any(r.startswith("bytes=-") for r in ranges) and any(r[6:7].isdigit() for r in ranges)
        with zz.Pipeline(zz.BatchSpec(2, (6, 6, 6), "f32"), limits=SMALL) as pl:
            pl.push([zz.Sample(f"{base}/s.zarr", aabb), zz.Sample(f"{base}/c.zarr", aabb)])
            with pl.pop(timeout=60) as b:
                x = b.numpy()
                np.testing.assert_array_equal(x[0], _crop_ref(sharded, aabb, 0).astype(np.float32))
                np.testing.assert_array_equal(x[1], _crop_ref(ref_c, aabb, np.float32("nan")))
                del x
        _corrupt_index(str(tmp_path / "s.zarr"))
        r = zz.reader()  # fresh caches
        with pytest.raises(zrecord.CorruptStoreError, match="shard index"):
            r.read(f"{base}/s.zarr")
        with pytest.raises(FileNotFoundError):
            zz.read(f"{base}/missing.zarr")
    finally:
        srv.close()


def test_s3_sources(tmp_path, monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"}.items():
            monkeypatch.setenv(k, v)
        data = _data((9, 17, 13), "uint16")
        _v3(tmp_path / "a.zarr", data, (2, 5, 3), shards=(4, 10, 6), compressors=[ZstdCodec(level=1)])
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
        bucket = f"zrecord-test-{port}"
        s3.create_bucket(Bucket=bucket)
        for root, _, files in os.walk(tmp_path / "a.zarr"):
            for f in files:
                full = os.path.join(root, f)
                s3.upload_file(full, bucket, "data/" + os.path.relpath(full, tmp_path))
        uri = f"s3://{bucket}/data/a.zarr"
        np.testing.assert_array_equal(np.from_dlpack(zz.read(uri)), data)
        aabb = [(3, 9), (-2, 4), (10, 16)]
        np.testing.assert_array_equal(np.from_dlpack(zz.gather([zz.Sample(uri, aabb)]))[0], _crop_ref(data, aabb, 0))
        with pytest.raises(FileNotFoundError):
            zz.read(f"s3://{bucket}/data/nothing.zarr")
    finally:
        server.stop()


def test_hostile_metadata_and_absurd_selections(tmp_path):
    data = _data((4, 4), "uint8")
    p = tmp_path / "a"
    _v3(p, data, (2, 2), compressors=None)
    meta = json.loads((p / "zarr.json").read_text())
    big = dict(meta, shape=[1 << 40, 1 << 40], chunk_grid={"name": "regular", "configuration": {"chunk_shape": [1 << 30, 1 << 30]}})
    (p / "zarr.json").write_text(json.dumps(big))
    with pytest.raises(ValueError, match="absurdly large"):
        zz.info(str(p))
    (p / "zarr.json").write_text(json.dumps(dict(meta, shape=[1 << 40, 4])))
    r = zz.reader()
    with pytest.raises((MemoryError, ValueError)):
        r.read(str(p))  # 2^42 bytes: refused, not attempted
    with pytest.raises(ValueError, match="larger than"):
        r.gather([zz.Sample(str(p), [(0, 1 << 30), (0, 1)])])
    (p / "zarr.json").write_text("{not json")
    with pytest.raises(ValueError, match="zarr.json"):
        zz.reader().info(str(p))
    # a shard index pointing past the shard's data is corruption, not a wild read
    q = str(tmp_path / "s")
    _v3(q, _data((4, 4), "uint8"), (2, 2), shards=(4, 4), compressors=None)
    shard = os.path.join(q, "c", "0", "0")
    b = bytearray(open(shard, "rb").read())
    import struct

    google_crc32c = pytest.importorskip("google_crc32c")  # zarr's own crc32c dependency
    n = 4 * 16
    index = bytearray(b[-(n + 4) : -4])
    index[0:8] = struct.pack("<Q", 1 << 40)  # first entry's offset far outside
    b[-(n + 4) :] = bytes(index) + struct.pack("<I", google_crc32c.value(bytes(index)))
    open(shard, "wb").write(bytes(b))
    with pytest.raises(zrecord.CorruptStoreError, match="outside the shard"):
        zz.reader().read(q)

"""Stores and dataset roots on object storage: a real S3 server (moto in server mode) and a
static HTTP server with Range requests, both on loopback. Everything read from a URL must equal
the local reference; publishing is create-only; failures are typed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import zrecord
from _servers import DelayProxy, RangeServer, zrec_bin

pytest.importorskip("moto.server")
pytest.importorskip("boto3")

N = 300


_bucket_n = [0]


@pytest.fixture
def bucket(s3):
    _bucket_n[0] += 1
    return s3.bucket(f"zrecord-remote-{os.getpid()}-{_bucket_n[0]}")


def dense_data():
    rng = np.random.default_rng(1)
    return rng.integers(0, 255, size=(N, 8, 8, 3), dtype=np.uint8)


def ragged_data():
    return [np.arange(i % 29 + 1, dtype=np.int32) + 1000 * i for i in range(N)]


def write_dense(path, codec="raw"):
    with zrecord.DenseWriter(path, np.uint8, (8, 8, 3), codec, data_shards=2) as w:
        w.append(dense_data())


def write_ragged(path, codec="zstd"):
    with zrecord.RaggedWriter(path, np.int32, 1, codec, data_shards=3) as w:
        w.append(zrecord.RaggedBatch.from_records(ragged_data()))


def ragged_rows(batch):
    cu = np.from_dlpack(batch.cu_seqlens)
    vals = np.from_dlpack(batch.values)
    return [vals[cu[k] : cu[k + 1]] for k in range(len(cu) - 1)]


IDS = [299, 0, 17, 17, 150, 3, 298, 100, 5, 5, 200]


def test_write_read_s3_dense_and_ragged(s3, bucket):
    url_d = f"s3://{bucket}/train/images"
    url_r = f"s3://{bucket}/train/tokens"
    write_dense(url_d)
    write_ragged(url_r)
    keys = s3.keys(bucket, "train/images/")
    assert "train/images/manifest.json" in keys
    assert all(k == "train/images/manifest.json" or k.startswith("train/images/upload-") for k in keys), keys
    d = zrecord.open(url_d)
    assert isinstance(d, zrecord.DenseStore) and len(d) == N and d.path == url_d
    got = np.from_dlpack(d.bind(zrecord.Allocator()).gather(IDS))
    np.testing.assert_array_equal(got, dense_data()[IDS])
    r = zrecord.open(url_r)
    assert isinstance(r, zrecord.RaggedStore) and len(r) == N
    rows = ragged_rows(r.bind(zrecord.Allocator()).gather(IDS))
    for k, i in enumerate(IDS):
        np.testing.assert_array_equal(rows[k], ragged_data()[i])
    # every record, in order, and a range read
    allr = ragged_rows(r.bind(zrecord.Allocator())[0:N])
    assert len(allr) == N and all(np.array_equal(a, b) for a, b in zip(allr, ragged_data()))
    assert d.verify() == N and r.verify() == N
    with pytest.raises(IndexError):
        d.bind(zrecord.Allocator()).gather([N])
    # stores pickle as their URL and reopen remotely
    import pickle

    d2 = pickle.loads(pickle.dumps(d))
    assert d2.path == url_d and len(d2) == N


def test_publish_is_create_only_and_losers_clean_up(s3, bucket):
    url = f"s3://{bucket}/s"
    # two writers start before either publishes: the first to publish wins, the second gets
    # FileExistsError and removes what it uploaded
    a = zrecord.DenseWriter(url, np.uint8, (8, 8, 3), "raw")
    b = zrecord.DenseWriter(url, np.uint8, (8, 8, 3), "zstd")
    a.append(dense_data())
    b.append(dense_data()[::-1].copy())
    a.close()
    after_a = s3.keys(bucket)
    with pytest.raises(FileExistsError):
        b.close()
    assert s3.keys(bucket) == after_a, "nothing overwritten, nothing left behind"
    with pytest.raises(FileExistsError):
        write_dense(url)  # refused before any upload
    assert s3.keys(bucket) == after_a
    np.testing.assert_array_equal(np.from_dlpack(zrecord.open(url).bind(zrecord.Allocator()).gather([3])), dense_data()[[3]])


def test_manifest_put_is_conditional(s3, bucket):
    """Writer B passed its early existence check and is uploading (through a proxy that delays
    each of its requests) when A publishes: B's create-only manifest put fails (412 from the
    server), B removes its uploads, A's store is intact."""
    url = f"s3://{bucket}/race"
    port = int(s3.endpoint.rsplit(":", 1)[1])
    proxy = DelayProxy(port, 0.4)
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "aws_region": "us-east-1"}
    zrecord.set_storage_options(url, dict(creds, aws_endpoint=f"http://127.0.0.1:{proxy.port}"))
    b = zrecord.DenseWriter(url, np.uint8, (8, 8, 3), "zstd")  # checks now: nothing there yet
    zrecord.set_storage_options(url, dict(creds, aws_endpoint=s3.endpoint))
    b.append(dense_data()[::-1].copy())
    result = {}

    def close_b():
        try:
            b.close()
            result["ok"] = True
        except Exception as e:  # noqa: BLE001 - the test inspects it
            result["err"] = e

    import threading

    t = threading.Thread(target=close_b)
    t.start()
    deadline = time.time() + 30
    # B's two checks at creation and its check at publish are done once its uploads start
    while proxy.requests < 4 and time.time() < deadline:
        time.sleep(0.01)
    write_dense(url)  # A: straight to the server, published while B still uploads
    t.join(120)
    assert isinstance(result.get("err"), FileExistsError), result
    assert any(line.startswith("PUT") and "race/manifest.json" in line for line in proxy.lines), proxy.lines  # refused by the server
    keys = s3.keys(bucket, "race/")
    dirs = {k.split("/")[1] for k in keys if k.startswith("race/upload-")}
    assert len(dirs) == 1, keys  # only A's upload folder is left
    np.testing.assert_array_equal(np.from_dlpack(zrecord.open(url).bind(zrecord.Allocator()).gather([9])), dense_data()[[9]])


WRITER = r"""
import sys, numpy as np, zrecord
url = sys.argv[1]
rng = np.random.default_rng(0)
with zrecord.DenseWriter(url, np.uint8, (1024, 1024), "raw", data_shards=4) as w:
    for _ in range(12):
        w.append(rng.integers(0, 255, size=(16, 1024, 1024), dtype=np.uint8))
print("published", flush=True)
"""


def test_killed_writer_leaves_nothing_that_opens(s3, bucket, tmp_path):
    url = f"s3://{bucket}/big"
    env = dict(os.environ, ZRECORD_STAGING_DIR=str(tmp_path / "staging"))
    p = subprocess.Popen([sys.executable, "-c", WRITER, url], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        # kill as soon as the upload has started (a data object appeared), before the manifest
        while time.time() < deadline and p.poll() is None:
            keys = s3.keys(bucket, "big/")
            if any(k.startswith("big/upload-") for k in keys):
                break
            time.sleep(0.02)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    # requests the writer sent before it died may still complete on the server: let them land
    left, t = s3.keys(bucket, "big/"), time.time()
    while time.time() - t < 30:
        time.sleep(0.5)
        now = s3.keys(bucket, "big/")
        if now == left:
            break
        left = now
    assert left and all(k.startswith("big/upload-") for k in left), left  # killed mid-upload
    assert "big/manifest.json" not in left
    with pytest.raises(FileNotFoundError):
        zrecord.open(url)
    # zrec gc lists and removes what the killed writer uploaded
    zrec = zrec_bin()
    out = subprocess.run([zrec, "gc", url], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "removed: s3://" in out.stdout and "1 leftover data folder(s) removed" in out.stdout, out.stdout
    assert s3.keys(bucket, "big/") == []


def test_dataset_roots_loader_and_sql(s3, bucket, tmp_path):
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"label": pa.array(np.arange(N, dtype=np.int64) % 7), "text": pa.array([f"row {i} " * (i % 5 + 1) for i in range(N)])})
    url = f"s3://{bucket}/root"
    zrecord.write_dataset(table, url, codec="zstd", progress=False)
    zrecord.write_dataset(table, tmp_path / "root", codec="zstd", progress=False)
    assert f"root/dataset.json" in s3.keys(bucket, "root/")
    ds = zrecord.Dataset(url)
    assert ds.path == url and len(ds) == N
    # SQL: FROM 'url', registered tables and CREATE EXTERNAL TABLE all equal the local root
    ctx = zrecord.SessionContext()
    q = "SELECT _id, label, text FROM {} WHERE label = 3 ORDER BY _id"
    want = ctx.sql(q.format(f"'{tmp_path / 'root'}'")).to_arrow()
    assert ctx.sql(q.format(f"'{url}'")).to_arrow().equals(want)
    ctx.register("t", url)
    assert ctx.sql(q.format("t")).to_arrow().equals(want)
    ctx.sql(f"CREATE EXTERNAL TABLE e STORED AS ZRECORD LOCATION '{url}'").to_arrow()
    assert ctx.sql(q.format("e")).to_arrow().equals(want)
    got = ctx.sql("SELECT text FROM gather('t', [299, 0, 5])").to_arrow().column(0).to_pylist()
    assert got == [table["text"][i].as_py() for i in (299, 0, 5)]
    # COPY to S3, then read back
    out = f"s3://{bucket}/copied"
    ctx.sql(f"COPY (SELECT label FROM t WHERE label < 2) TO '{out}' STORED AS ZRECORD").to_arrow()
    back = ctx.sql(f"SELECT label FROM '{out}' ORDER BY _id").to_arrow().column(0).to_pylist()
    assert back == [v for v in table["label"].to_pylist() if v < 2]
    # the loader over remote views: same batches as over the local stores
    views = {"label": [ds_store.bind(zrecord.Allocator()) for ds_store in [zrecord.open(f"{url}/000-label")]]}
    local = {"label": [zrecord.open(tmp_path / "root" / "000-label").bind(zrecord.Allocator())]}
    def ids(loader, steps):
        return [np.from_dlpack(next(loader)[0]["label"]).tolist() for _ in range(steps)]
    with zrecord.Loader(views, zrecord.Sampler(N, 32, "iid", seed=5), workers=2) as a, zrecord.Loader(local, zrecord.Sampler(N, 32, "iid", seed=5), workers=0) as b:
        assert ids(a, 6) == ids(b, 6)
    # other objects on the same bucket (Parquet) go to DataFusion's file tables through the
    # same connected object store
    import pyarrow.parquet as pq

    pq.write_table(table, tmp_path / "t.parquet")
    s3.client.upload_file(str(tmp_path / "t.parquet"), bucket, "files/t.parquet")
    n = ctx.sql(f"SELECT count(*) AS n, sum(label) AS s FROM 's3://{bucket}/files/t.parquet'").to_arrow().to_pylist()
    assert n == [{"n": N, "s": sum(table["label"].to_pylist())}]
    # zrec info / verify / sql accept URLs
    zrec = zrec_bin()
    for args in (["info", url], ["verify", "--quiet", url], ["sql", f"SELECT count(*) AS n FROM '{url}'"]):
        r = subprocess.run([zrec, *args], capture_output=True, text=True)
        assert r.returncode == 0, (args, r.stderr)
    assert "300" in r.stdout


def test_storage_options_instead_of_environment(s3, bucket, monkeypatch):
    url = f"s3://{bucket}/opts"
    write_dense(url)
    for k in s3.env:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    opts = {"aws_endpoint": s3.endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing", "aws_region": "us-east-1", "zrecord_max_inflight": "4"}
    other = f"s3://{bucket}-other/x"
    s = zrecord.open(url, storage_options=opts)
    np.testing.assert_array_equal(np.from_dlpack(s.bind(zrecord.Allocator()).gather([7, 1])), dense_data()[[7, 1]])
    with pytest.raises(ValueError, match="no_such_key"):
        zrecord.open(other, storage_options={"no_such_key": "1"})
    with pytest.raises(ValueError, match="zrecord_max_inflight"):
        zrecord.set_storage_options(other, {"zrecord_max_inflight": "0"})


@pytest.fixture
def http_store(tmp_path):
    write_dense(tmp_path / "srv" / "d", codec="raw")
    write_ragged(tmp_path / "srv" / "r", codec="zstd")
    srv = RangeServer(tmp_path / "srv")
    try:
        yield srv
    finally:
        srv.close()


def test_http_reads_coalesce_and_retry(http_store):
    srv = http_store
    d = zrecord.open(f"{srv.url}/d")
    view = d.bind(zrecord.Allocator())
    srv.requests.clear()
    ids = list(range(0, N, 3))
    np.testing.assert_array_equal(np.from_dlpack(view.gather(ids)), dense_data()[ids])
    # index pages + coalesced record ranges: a handful of requests, not one per record
    assert 0 < len(srv.requests) <= 8, srv.requests
    r = zrecord.open(f"{srv.url}/r").bind(zrecord.Allocator())
    rows = ragged_rows(r.gather(IDS))
    for k, i in enumerate(IDS):
        np.testing.assert_array_equal(rows[k], ragged_data()[i])
    # transient 503s are retried with backoff
    srv.fail_next = 3
    fresh = zrecord.open(f"{srv.url}/d").bind(zrecord.Allocator())
    np.testing.assert_array_equal(np.from_dlpack(fresh.gather([5, 4])), dense_data()[[5, 4]])
    assert srv.failed == 3


def test_http_permanent_errors_are_typed(http_store):
    srv = http_store
    with pytest.raises(FileNotFoundError, match="/nothing"):
        zrecord.open(f"{srv.url}/nothing")
    srv.forbidden.add("d/")
    with pytest.raises(PermissionError, match=r"127\.0\.0\.1.*/d/manifest\.json.*403"):
        zrecord.open(f"{srv.url}/d")
    srv.forbidden.clear()
    d = zrecord.open(f"{srv.url}/d").bind(zrecord.Allocator())
    srv.forbidden.add("d/data")
    with pytest.raises(PermissionError, match="bytes"):
        d.gather(list(range(N)))
    with pytest.raises(ValueError, match="scheme"):
        zrecord.open("ftp://host/x")


def test_http_missing_data_object_is_file_not_found(tmp_path):
    """A store whose manifest lists a data object the server does not have: FileNotFoundError
    naming the object and the 404 (the documented rule for a missing object), at open."""
    write_ragged(tmp_path / "srv" / "r", codec="zstd")
    data = sorted(p.name for p in (tmp_path / "srv" / "r").iterdir() if p.name.startswith("data"))
    (tmp_path / "srv" / "r" / data[-1]).unlink()
    srv = RangeServer(tmp_path / "srv")
    try:
        with pytest.raises(FileNotFoundError, match=rf"/r/{data[-1]}.*404"):
            zrecord.open(f"{srv.url}/r")
    finally:
        srv.close()


def _read_pickled(blob, ids):
    """In a spawned process (no credentials in its environment): unpickle a view and read."""
    import pickle

    view = pickle.loads(blob)
    return np.from_dlpack(view.gather(np.asarray(ids, np.uint64))).tolist()


def _open_pickled(blob):
    """In a spawned process: unpickle a dataset root and read a record, or say what was raised."""
    import pickle

    try:
        ds = pickle.loads(blob)
        return ("ok", np.from_dlpack(ds.view("k", zrecord.Allocator()).gather(np.array([3], np.uint64))).tolist())
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def test_adapters_take_urls(s3, bucket):
    pa = pytest.importorskip("pyarrow")
    root = f"s3://{bucket}/adapters/root"
    store = f"s3://{bucket}/adapters/store"
    table = pa.table({"k": np.arange(50, dtype=np.int64), "t": [f"w{i}" for i in range(50)]})
    zrecord.write_dataset(table, root, progress=False)
    write_dense(store)
    import zrecord.grain as zg

    src = zg.DataSource(root)
    assert len(src) == 50 and src[7] == {"k": 7, "t": "w7"}
    assert [r["k"] for r in src.__getitems__([49, 0])] == [49, 0]
    dense = zg.DataSource(store + "/")
    np.testing.assert_array_equal(dense[3], dense_data()[3])
    torch = pytest.importorskip("torch")
    import zrecord.torch as zt

    ds = zt.Dataset(root)
    assert ds[4] == {"k": torch.tensor(4), "t": "w4"}
    assert ds.gather([9, 2])["t"] == ["w9", "w2"]
    assert torch.equal(zt.Dataset(store).gather([5, 1]), torch.from_numpy(dense_data()[[5, 1]]))
    it = zt.IterableDataset(root, batch_size=8, mode="cyclic", seed=3, rank=0, world_size=1)
    assert sorted(i for b in it for i in b["k"].tolist()) == list(range(50))
    with pytest.raises(FileNotFoundError):
        zt.Dataset(f"s3://{bucket}/adapters/nothing")


def test_storage_options_travel_with_pickles_to_spawned_workers(s3, bucket, monkeypatch):
    import multiprocessing as mp
    import pickle

    pa = pytest.importorskip("pyarrow")
    url = f"s3://{bucket}/travel"
    table = pa.table({"k": np.arange(64, dtype=np.int64), "t": [f"x{i}" for i in range(64)]})
    zrecord.write_dataset(table, url, progress=False)
    # From here on no credentials in the environment (spawned processes inherit it), and the
    # instance-metadata endpoint a credential-less client would ask is a closed loopback port.
    for k in s3.env:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
    secret = "s3cr3t-travel-7f3a"
    opts = {"aws_endpoint": s3.endpoint, "aws_access_key_id": "AKIDTRAVEL", "aws_secret_access_key": secret, "aws_region": "us-east-1", "allow_http": "true", "zrecord_max_retries": "0"}
    zrecord.set_storage_options(url, opts)
    view = zrecord.open(f"{url}/000-k").bind(zrecord.Allocator())
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_read_pickled, (pickle.dumps(view), [5, 1, 63])) == [5, 1, 63]
        assert pool.apply(_open_pickled, (pickle.dumps(zrecord.Dataset(url)),)) == ("ok", [3])
    torch = pytest.importorskip("torch")
    import zrecord.torch as zt

    for dl in (
        zt.Dataset(url).dataloader(batch_size=16, num_workers=2, multiprocessing_context="spawn"),
        torch.utils.data.DataLoader(zt.IterableDataset(url, batch_size=8, mode="sequential", rank=0, world_size=1), batch_size=None, num_workers=2, multiprocessing_context="spawn"),
    ):
        seen = sorted(i for b in dl for i in b["k"].tolist())
        assert seen == list(range(64))
    # Secrets kept out of pickles: the other process has no credentials, and says so.
    zrecord.set_storage_options(url, opts, pickle_secrets=False)
    blob = pickle.dumps(zrecord.Dataset(url))
    assert secret.encode() not in blob and b"AKIDTRAVEL" not in blob
    assert s3.endpoint.encode() in blob
    with mp.get_context("spawn").Pool(1) as pool:
        kind, msg = pool.apply(_open_pickled, (blob,))
    assert kind == "PermissionError", (kind, msg)
    assert "no credentials" in msg and "AWS_ACCESS_KEY_ID" in msg, msg

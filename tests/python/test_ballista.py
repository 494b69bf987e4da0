"""Distributed SQL on Ballista from Python: `SessionContext(ballista=...)` against a scheduler and
two executors started here as separate `zrec ballista` processes on loopback, with stores on a
real S3 server (moto) and on local disk. Results equal single-node DataFusion's."""

from __future__ import annotations

import json
import os
import subprocess
import time

import numpy as np
import pytest

import zrecord
from _servers import free_port, wait_listening, zrec_bin

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("moto.server")
pytest.importorskip("boto3")


N = 3000


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    """Scheduler + 2 executors; they reach the S3 server through the same environment."""
    zrec = zrec_bin()
    work = tmp_path_factory.mktemp("ballista")
    port = free_port()
    env = dict(os.environ)
    procs = [subprocess.Popen([zrec, "ballista", "scheduler", "--bind", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=open(work / "scheduler.err", "w"))]
    # The scheduler listening before any executor starts: an executor that cannot reach its
    # scheduler at start-up exits.
    try:
        wait_listening(port, time.time() + 120)
    except TimeoutError:
        procs[0].kill()
        raise
    listening = [port]
    for i in range(2):
        shuffle = work / f"executor-{i}"
        shuffle.mkdir()
        flight, grpc = free_port(), free_port()
        listening += [flight, grpc]
        args = ["ballista", "executor", "--scheduler", f"127.0.0.1:{port}", "--port", str(flight), "--grpc-port", str(grpc)]
        args += ["--work-dir", str(shuffle), "--concurrent-tasks", "2"]
        procs.append(subprocess.Popen([zrec, *args], env=env, stdout=subprocess.DEVNULL, stderr=open(work / f"executor-{i}.err", "w")))
    url = f"df://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        # Every executor listening before the first query (a query then never waits on an
        # executor still starting).
        for p in listening:
            wait_listening(p, deadline)
        while True:
            try:
                zrecord.SessionContext(ballista=url).sql("SELECT 1 AS one").to_arrow()
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)
        yield url
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def source(tmp_path):
    table = pa.table(
        {
            "k": pa.array(np.arange(N, dtype=np.int64)),
            "label": pa.array(np.arange(N, dtype=np.int64) % 7),
            "text": pa.array([f"doc {i} " * (i % 4 + 1) for i in range(N)]),
            "tokens": pa.array([list(range(i % 9 + 1)) for i in range(N)], type=pa.list_(pa.int32())),
        }
    )
    path = tmp_path / "src.parquet"
    pq.write_table(table, path, row_group_size=150)
    return table, path


def stream_records(root):
    """Every record of every stream, in id order (dense rows / ragged records as NumPy)."""
    ds = zrecord.Dataset(str(root))
    ctx = zrecord.SessionContext()
    ctx.register("t", str(root))
    return ctx.sql("SELECT * FROM t ORDER BY _id").to_arrow().drop_columns(["_id"]), ds


def test_distributed_copy_to_s3_equals_single_node(s3, cluster, source, tmp_path):
    table, path = source
    bucket = s3.bucket(f"zrecord-ballista-{os.getpid()}")
    dist_url = f"s3://{bucket}/dist"
    remote = zrecord.SessionContext(ballista=cluster, target_partitions=4)
    q = "COPY (SELECT k, label, text, tokens FROM '{src}') TO '{out}' STORED AS ZRECORD OPTIONS (codec 'zstd')"
    n = remote.sql(q.format(src=path, out=dist_url)).to_arrow()
    assert n.column(0).to_pylist() == [N]
    local = zrecord.SessionContext(target_partitions=4)
    local.sql(q.format(src=path, out=tmp_path / "one")).to_arrow()

    # Parts written by the executors, committed once: dataset.json last, one part per partition.
    keys = s3.keys(bucket, "dist/")
    assert f"dist/dataset.json" in keys
    got, ds = stream_records(dist_url)
    want, ds_local = stream_records(tmp_path / "one")
    assert len(ds) == N
    ks = got.column("k").to_pylist()
    assert ks == list(range(N)), ([ks[i] for i in range(0, N, 150)], s3.client.get_object(Bucket=bucket, Key="dist/dataset.json")["Body"].read().decode())
    assert got.equals(want)
    # ... the Parquet rows, in file order.
    for c in ("k", "label", "text", "tokens"):
        assert got.column(c).to_pylist() == table.column(c).to_pylist(), c

    # Queries on the cluster over the S3 root equal the single-node answers.
    for sql in (
        "SELECT label, count(*) AS c, sum(k) AS s FROM '{r}' GROUP BY label ORDER BY label",
        "SELECT _id, k, text FROM '{r}' WHERE _id IN (2999, 0, 1500) ORDER BY _id",
        "SELECT k, tokens FROM '{r}' WHERE label = 2 AND k > 2900 ORDER BY k",
    ):
        a = remote.sql(sql.format(r=dist_url)).to_arrow()
        b = local.sql(sql.format(r=tmp_path / "one")).to_arrow()
        assert a.to_pylist() == b.to_pylist() and a.num_rows > 0, sql

    # A second COPY to the same URL fails cleanly and overwrites nothing.
    with pytest.raises(Exception, match="(?i)already exists|AlreadyExists"):
        remote.sql(q.format(src=path, out=dist_url)).to_arrow()
    assert s3.keys(bucket, "dist/") == keys
    assert stream_records(dist_url)[0].equals(want)


def test_ballista_context_errors(cluster, tmp_path):
    with pytest.raises(ValueError):
        zrecord.SessionContext(ballista=cluster, target_partitions=0)
    remote = zrecord.SessionContext(ballista=cluster)
    # A store assembled in memory has no path the executors could open.
    view = zrecord.open(_tiny_store(tmp_path)).bind(zrecord.Allocator())
    remote.register_sources("mem", {"x": view})
    with pytest.raises(Exception, match="assembled in memory"):
        remote.sql("SELECT count(*) FROM mem WHERE x > 0").to_arrow()


def _tiny_store(tmp_path):
    path = tmp_path / "tiny"
    with zrecord.DenseWriter(path, np.int64, (), "raw") as w:
        w.append(np.arange(10, dtype=np.int64))
    return path


def test_cli_sql_on_ballista(cluster, source, tmp_path):
    """`zrec sql --ballista`: a distributed COPY from the command line, then a query over it."""
    table, path = source
    hostport = cluster.removeprefix("df://")
    out = tmp_path / "cli_root"
    zrec = zrec_bin()
    copy = f"COPY (SELECT k, text FROM '{path}' WHERE label = 4) TO '{out}' STORED AS ZRECORD"
    r = subprocess.run([zrec, "sql", "--ballista", hostport, "--partitions", "3", copy], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    want = [k for k, lab in zip(table.column("k").to_pylist(), table.column("label").to_pylist()) if lab == 4]
    back = zrecord.SessionContext().sql(f"SELECT k FROM '{out}' ORDER BY _id").to_arrow().column(0).to_pylist()
    assert back == want
    manifest = json.loads((out / "dataset.json").read_text())
    assert manifest["version"] == 2 and len(manifest["parts"]) == 3, manifest
    r = subprocess.run([zrec, "sql", "--ballista", hostport, f"SELECT count(*) AS n, sum(k) AS s FROM '{out}'"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert str(len(want)) in r.stdout and str(sum(want)) in r.stdout, r.stdout
    # A bad scheduler address is a clear error, not a hang.
    r = subprocess.run([zrec, "sql", "--ballista", "127.0.0.1:1", "SELECT 1"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "127.0.0.1:1" in r.stderr, r.stderr

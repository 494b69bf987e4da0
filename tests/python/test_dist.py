"""Distributed store across processes: 2 and 4 ranks on one host (shared memory and Flight over
loopback), ranks in separate network namespaces (Flight across a veth link), extra members,
forked readers, killed / stopped / restarted ranks. Each rank is a separate Python process
running dist_worker.py; values encode their global id, so a misrouted row fails the test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from zrecord.dist import DistReader, DistStore, FileComm

WORKER = Path(__file__).with_name("dist_worker.py")


def spawn(scenario, d, rank, size, transport, ns="t", prefix=(), env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.Popen([*prefix, sys.executable, str(WORKER), scenario, str(d), str(rank), str(size), transport, ns], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


def result(p, timeout=180):
    out, err = p.communicate(timeout=timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, f"no result (rc {p.returncode})\nstdout: {out}\nstderr: {err[-3000:]}"
    r = json.loads(lines[-1])
    assert "error" not in r, f"{r.get('error')}: {r.get('message')}\n{r.get('trace', '')}\n{err[-2000:]}"
    return r


def wait_files(d, names, procs, timeout=120):
    deadline = time.monotonic() + timeout
    while not all((d / n).exists() for n in names):
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                raise AssertionError(f"a rank exited early: {out}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {names}"
        time.sleep(0.02)


@pytest.mark.parametrize("size,transport", [(2, "auto"), (2, "flight"), (4, "auto"), (4, "flight")])
def test_ranks_on_one_host(tmp_path, size, transport):
    procs = [spawn("basic", tmp_path, r, size, transport) for r in range(size)]
    results = [result(p) for p in procs]
    for r in results:
        n = r["n"]
        assert n == sum(k + 3 for k in range(size))
        assert r["errors"] == {"span": "ValueError", "oob": "IndexError", "neg": "IndexError", "rows": "ValueError", "width": "ValueError", "dtype": "TypeError", "name": "ValueError", "empty_width": "ValueError"}
        if transport == "flight":
            assert r["requests"] > 0
        else:
            assert r["requests"] == 0, "ranks on one host read each other's shards in place"


def test_extra_member_joins(tmp_path):
    procs = [spawn("serve", tmp_path, r, 2, "auto") for r in range(2)]
    wait_files(tmp_path, ["ready.0", "ready.1"], procs)
    extra = spawn("extra", tmp_path, 0, 2, "auto")
    r = result(extra)
    assert r["ok"]
    (tmp_path / "stop").write_text("1")
    for p in procs:
        result(p)


def test_fork_reader_in_forked_workers(tmp_path):
    procs = [spawn("fork", tmp_path, r, 2, "flight") for r in range(2)]
    for p in procs:
        assert result(p)["ok"]


@pytest.mark.parametrize("transport", ["auto", "flight"])
def test_killed_rank_is_an_error_not_a_hang_and_restarted_rank_rejoins(tmp_path, transport):
    env = {"DIST_TIMEOUT": "5"}
    r0 = spawn("read_after", tmp_path, 0, 2, transport, env=env)
    r1 = spawn("serve", tmp_path, 1, 2, transport, env=env)
    wait_files(tmp_path, ["ready.0", "ready.1"], [r0, r1])
    r1.kill()
    r1.wait()
    (tmp_path / "go").write_text("1")
    wait_files(tmp_path, ["done.go"], [r0], timeout=60)
    first = json.loads((tmp_path / "done.go").read_text())
    assert first.get("error") == "ConnectionError", first
    assert "rank 1" in first["message"] and "'feat'" in first["message"], first
    assert first["s"] < 5.0, first
    # The restarted rank publishes its new endpoint and shard; the reader finds it.
    (tmp_path / "ready.1").unlink()
    r1b = spawn("rejoin", tmp_path, 1, 2, transport, env=env)
    wait_files(tmp_path, ["ready.1"], [r1b])
    (tmp_path / "go2").write_text("1")
    wait_files(tmp_path, ["done.go2"], [r0], timeout=60)
    second = json.loads((tmp_path / "done.go2").read_text())
    assert second.get("ok"), second
    (tmp_path / "stop").write_text("1")
    result(r0)
    result(r1b)


def test_stopped_rank_times_out(tmp_path):
    env = {"DIST_TIMEOUT": "2"}
    r0 = spawn("read_after", tmp_path, 0, 2, "flight", env=env)
    r1 = spawn("serve", tmp_path, 1, 2, "flight", env=env)
    wait_files(tmp_path, ["ready.0", "ready.1"], [r0, r1])
    os.kill(r1.pid, signal.SIGSTOP)
    try:
        (tmp_path / "go").write_text("1")
        wait_files(tmp_path, ["done.go"], [r0], timeout=60)
        first = json.loads((tmp_path / "done.go").read_text())
        assert first.get("error") == "TimeoutError", first
        assert "rank 1" in first["message"] and 1.5 < first["s"] < 6.0, first
    finally:
        os.kill(r1.pid, signal.SIGCONT)
    (tmp_path / "go2").write_text("1")
    wait_files(tmp_path, ["done.go2"], [r0], timeout=60)
    assert json.loads((tmp_path / "done.go2").read_text()).get("ok")
    (tmp_path / "stop").write_text("1")
    result(r0)
    result(r1)


def _mpiexec():
    try:
        import mpi4py  # noqa: F401
        from mpi4py import MPI  # noqa: F401  (the MPI library loads)
    except Exception:  # noqa: BLE001
        return None
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


@pytest.mark.parametrize("size,transport", [(2, "auto"), (4, "auto"), (2, "mpi"), (4, "mpi")])
def test_ranks_under_mpiexec(tmp_path, size, transport):
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpi4py with an MPI library (pip install mpi4py mpich) is not installed")
    p = subprocess.run([mpiexec, "-n", str(size), sys.executable, str(WORKER), "mpi", str(tmp_path), "0", str(size), transport], capture_output=True, text=True, timeout=300)
    # Ranks share one stdout under mpiexec: each also writes its result to a file.
    files = sorted(tmp_path.glob("result.t-mpi.*.json"))
    assert p.returncode == 0 and len(files) == size, f"rc {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    lines = [json.loads(f.read_text()) for f in files]
    for r in lines:
        assert "error" not in r, r
        assert r["n"] == sum(k + 3 for k in range(size))
        assert r["errors"] == {"span": "ValueError", "oob": "IndexError", "neg": "IndexError", "rows": "ValueError", "width": "ValueError", "dtype": "TypeError", "name": "ValueError", "empty_width": "ValueError"}
        # Array variables read through RMA windows; the store-backed one ("tok") cannot.
        assert r["mpi_windows"] == (["feat", "lab", "raw", "w"] if transport == "mpi" else []), r["mpi_windows"]
        # get_profile counts reads of either path: RMA epochs on other ranks are its requests
        # (one host: shared memory otherwise, no requests).
        assert r["calls"] > 0, r
        assert (r["requests"] > 0) == (transport == "mpi"), r
    assert sorted(r["rank"] for r in lines) == list(range(size))


def _netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["ip", "netns", "add", "zrecprobe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "zrecprobe"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair (10.77.0.1 <-> 10.77.0.2)."""
    if not _netns_available():
        pytest.skip("network namespaces need root and iproute2 (CI installs iproute2 and runs as root)")
    tag = f"zr{os.getpid() % 100000}"
    ns = [f"{tag}a", f"{tag}b"]
    sh = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    try:
        for n in ns:
            sh("ip", "netns", "add", n)
        sh("ip", "link", "add", f"{tag}0", "type", "veth", "peer", "name", f"{tag}1")
        for i, n in enumerate(ns):
            sh("ip", "link", "set", f"{tag}{i}", "netns", n)
            sh("ip", "-n", n, "addr", "add", f"10.77.0.{i + 1}/24", "dev", f"{tag}{i}")
            sh("ip", "-n", n, "link", "set", f"{tag}{i}", "up")
            sh("ip", "-n", n, "link", "set", "lo", "up")
        yield ns
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


@pytest.mark.parametrize("size", [2, 4])
def test_ranks_on_separate_hosts(tmp_path, two_hosts, size):
    # Ranks alternate between the two namespaces: every other rank is across the link.
    procs = [spawn("basic", tmp_path, r, size, "auto", prefix=("ip", "netns", "exec", two_hosts[r % 2])) for r in range(size)]
    results = [result(p) for p in procs]
    for r in results:
        assert r["requests"] > 0, "ranks in other namespaces are read over Flight"
        assert r["errors"]["oob"] == "IndexError"


def test_filecomm_in_process_errors(tmp_path):
    with pytest.raises(ValueError):
        FileComm(str(tmp_path), 3, 2, "x")
    with pytest.raises(ValueError):
        FileComm(str(tmp_path), 0, 1, "bad/ns")
    c = FileComm(str(tmp_path), 0, 2, "x", timeout=0.2)
    with pytest.raises(TimeoutError, match=r"\[1\]"):
        c.allgather({"a": 1})
    solo = FileComm(str(tmp_path), 0, 1, "solo")
    assert solo.allgather({"a": 1}) == [{"a": 1}]
    solo.barrier()


def test_single_rank_store_in_process(tmp_path):
    s = DistStore(None, rendezvous=tmp_path, rank=0, size=1, namespace="one")
    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    s.add("x", x)
    out = np.empty((3, 2))
    s.get_batch("x", out, [9, 0, 9])
    np.testing.assert_array_equal(out, x[[9, 0, 9]])
    with pytest.raises(ValueError, match="already registered"):
        s.add("x", x)
    with pytest.raises(ValueError, match="C-contiguous|contiguous"):
        s.add("y", x[:, ::2].T)
    # A failed add leaves no half variable; the name can be used again.
    s.add("y", np.ascontiguousarray(x[:, :1]))
    assert s.info("y") == (10, 1, 8)
    with pytest.raises(TypeError):
        s.get_batch("x", out, np.array([0.5, 1.0, 2.0]))
    with pytest.raises(RuntimeError):
        s.join("x")
    r = s.fork_reader()
    assert isinstance(r, DistReader)
    np.testing.assert_array_equal(np.from_dlpack(r.gather("x", [3])), x[[3]])
    s.free()
    s.free()  # idempotent

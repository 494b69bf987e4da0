"""`zrec` for pip users: the wheel's console script and `python -m zrecord` run the clap command
line compiled into the extension (no Rust toolchain on PATH: scripts/test_python.sh strips it)."""

import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import zrecord

SCRIPT = os.path.join(os.path.dirname(sys.executable), "zrec")


def commands():
    """Both spellings of the command: the console script (when the wheel is installed) and
    `python -m zrecord` (always)."""
    out = [[sys.executable, "-m", "zrecord"]]
    if os.path.exists(SCRIPT):
        out.insert(0, [SCRIPT])
    return out


def no_rust_env():
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if ".cargo" not in p and ".rustup" not in p)
    return dict(os.environ, PATH=path, ZRECORD_PROGRESS="0")


def run(cmd, *args, **kw):
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, env=no_rust_env(), timeout=120, **kw)


@pytest.fixture(params=range(2), ids=["console_script", "python_m"])
def zrec(request):
    cmds = commands()
    if request.param >= len(cmds):
        pytest.skip("zrecord is not installed from a wheel here (no console script)")
    return cmds[request.param]


def test_console_script_is_installed_with_the_wheel():
    if "site-packages" not in zrecord.__file__:
        pytest.skip("zrecord imported from the source tree, not an installed wheel")
    assert os.path.exists(SCRIPT), "installing the wheel must install a zrec command"


def test_version_help_and_usage_errors(zrec):
    r = run(zrec, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"zrec {zrecord.__version__}", r
    r = run(zrec, "--help")
    assert r.returncode == 0
    for command in ("info", "verify", "sql", "convert", "gc", "demo", "ballista"):
        assert f"\n  {command} " in r.stdout, (command, r.stdout)
    # clap's usage errors: exit 2, message on stderr, no Python traceback.
    r = run(zrec, "frobnicate")
    assert r.returncode == 2 and "unrecognized subcommand 'frobnicate'" in r.stderr and "Traceback" not in r.stderr
    r = run(zrec, "info")
    assert r.returncode == 2 and "<PATH>" in r.stderr


def test_info_verify_and_corruption_exit_codes(zrec, tmp_path):
    data = np.arange(60, dtype=np.float32).reshape(10, 2, 3)
    with zrecord.DenseWriter(tmp_path / "x", np.float32, (2, 3), "zstd") as w:
        w.append(data)
    r = run(zrec, "info", tmp_path / "x")
    assert r.returncode == 0, r.stderr
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in r.stdout.splitlines())
    assert (fields["kind"], fields["dtype"], fields["item_shape"], fields["records"]) == ("dense", "float32", "[2, 3]", "10"), r.stdout
    assert fields["codec"].startswith("zstd") and fields["raw bytes"].startswith("240 ")
    r = run(zrec, "verify", tmp_path / "x", "--quiet")
    assert r.returncode == 0 and r.stdout.strip() == f"ok: 10 records verified in {tmp_path / 'x'}", r
    shard = next(p for p in (tmp_path / "x").iterdir() if p.name.startswith("data-") and p.stat().st_size > 64)
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    r = run(zrec, "verify", tmp_path / "x", "--quiet")
    assert r.returncode == 2 and r.stderr.startswith("CORRUPT:") and shard.name in r.stderr, r
    r = run(zrec, "info", tmp_path / "missing")
    assert r.returncode == 1 and r.stderr.startswith("error:") and "missing" in r.stderr, r


def test_convert_then_sql_to_a_file(zrec, tmp_path):
    t = pa.table({"label": pa.array([3, 1, 4, 1, 5], pa.int64()), "text": ["a", "bb", "ccc", "d", "ee"]})
    pq.write_table(t, tmp_path / "d.parquet")
    r = run(zrec, "convert", tmp_path / "d.parquet", tmp_path / "root", "--quiet", "--codec", "raw")
    assert r.returncode == 0 and "converted" in r.stdout, r
    got = zrecord.Dataset(tmp_path / "root").bind()
    assert np.from_dlpack(got["label"][[0, 1, 2, 3, 4]]).tolist() == [3, 1, 4, 1, 5]
    r = run(zrec, "sql", "SELECT _id, label, text FROM t WHERE label = 1 ORDER BY _id", "--table", f"t={tmp_path / 'root'}", "-o", tmp_path / "out.parquet")
    assert r.returncode == 0, r
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.to_pydict() == {"_id": [1, 3], "label": [1, 1], "text": ["bb", "d"]}
    # An existing output is refused, never replaced.
    r = run(zrec, "sql", "SELECT 1", "-o", tmp_path / "out.parquet")
    assert r.returncode == 1 and "exists" in r.stderr, r


def test_closed_pipe_ends_quietly(zrec, tmp_path):
    """`zrec sql ... | head -1`: the reader closing the pipe ends zrec with the shell's SIGPIPE
    status (141), not a Python traceback (SIGPIPE itself stays ignored, as in the binary:
    the Ballista servers must survive a peer closing a socket)."""
    with zrecord.DenseWriter(tmp_path / "x", np.int64, (), "raw") as w:
        w.append(np.arange(100_000, dtype=np.int64))
    p = subprocess.Popen([*zrec, "sql", "SELECT _id FROM t", "--table", f"t={tmp_path / 'x'}", "--max-rows", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=no_rust_env())
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    assert first.startswith(b"+")
    assert rc == 141, (rc, err)
    assert "Traceback" not in err


def test_in_process_entry_returns_the_exit_code(capfd):
    from zrecord._cli import main

    assert main(["--version"]) == 0
    assert capfd.readouterr().out.strip() == f"zrec {zrecord.__version__}"
    assert main(["verify"]) == 2
    assert "<PATH>" in capfd.readouterr().err

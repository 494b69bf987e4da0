"""Distributed COPY on Ballista vs the same COPY on one machine.

A Parquet source of dense-vision rows (a uint8 [3, 64, 64] image and an int64 label per row;
`--gb` of image bytes, default 2) is converted into a zrecord root twice, by the same `zrec`
binary, in the same run:

- single node: `zrec sql --partitions P "COPY (SELECT * FROM 'src.parquet') TO ... STORED AS ZRECORD"`
- Ballista: a `zrec ballista scheduler` and E `zrec ballista executor` processes (one task slot
  each) on loopback, `zrec sql --ballista ... --partitions P` with the same statement.

Both write P parts (the Parquet file split by byte range) and commit once. Reported: wall time,
MB/s of source image bytes, the ratio, a scan-only pass (`SELECT sum(label), count(image)` over
the same file) to show how much of the COPY is reading, and a record-by-record check of 2000
random records. On a 2-core machine the cluster cannot be faster: the figure shows what the
distribution costs (process hops, scheduling, shuffle of the part rows), not a speed-up.

    python benches/python/ballista_copy.py [--gb 2] [--executors 4] [--partitions 4] [--zrec PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_source(path: Path, gb: float, seed=0):
    side = 64
    row = 3 * side * side
    rows = int(gb * 1e9 / row)
    rng = np.random.default_rng(seed)
    per = 4096
    schema = pa.schema([("image", pa.list_(pa.uint8(), row)), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="none") as w:
        for start in range(0, rows, per):
            n = min(per, rows - start)
            # Smooth-ish pixels (compressible, like images), deterministic.
            base = rng.integers(0, 200, size=(n, 1), dtype=np.uint8)
            img = (base + (np.arange(row, dtype=np.uint32) % 56).astype(np.uint8)[None, :]).astype(np.uint8)
            arr = pa.FixedSizeListArray.from_arrays(pa.array(img.reshape(-1)), row)
            w.write_table(pa.table({"image": arr, "label": pa.array(np.arange(start, start + n, dtype=np.int64) % 1000)}, schema=schema), row_group_size=1024)
    return rows, rows * row


def run(cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{r.stderr}")
    return dt, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--executors", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--zrec", default=os.environ.get("ZREC_BIN") or str(Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "zrec"))
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    zrec = a.zrec
    if not os.path.exists(zrec):
        raise SystemExit(f"zrec binary not found at {zrec} (--zrec or ZREC_BIN)")
    work = Path(a.dir or tempfile.mkdtemp(prefix="zrec-ballista-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        src = work / "src.parquet"
        t = time.perf_counter()
        rows, nbytes = make_source(src, a.gb)
        print(f"source: {rows} rows, {nbytes / 1e9:.2f} GB of image bytes, {src.stat().st_size / 1e9:.2f} GB Parquet ({time.perf_counter() - t:.1f} s to write)")
        copy = "COPY (SELECT image, label FROM '{src}') TO '{out}' STORED AS ZRECORD OPTIONS (codec 'zstd', level '1')"

        scan_s, _ = run([zrec, "sql", "--partitions", str(a.partitions), f"SELECT sum(label) AS s, count(image) AS n FROM '{src}'"])
        single_s, _ = run([zrec, "sql", "--partitions", str(a.partitions), copy.format(src=src, out=work / "single")])

        port = free_port()
        log = open(work / "cluster.log", "w")
        procs.append(subprocess.Popen([zrec, "ballista", "scheduler", "--bind", f"127.0.0.1:{port}"], stdout=log, stderr=log))
        for i in range(a.executors):
            d = work / f"shuffle-{i}"
            d.mkdir(exist_ok=True)
            procs.append(
                subprocess.Popen(
                    [zrec, "ballista", "executor", "--scheduler", f"127.0.0.1:{port}", "--port", str(free_port()), "--grpc-port", str(free_port()), "--concurrent-tasks", "1", "--work-dir", str(d)],
                    stdout=log,
                    stderr=log,
                )
            )
        deadline = time.time() + 60
        while True:
            r = subprocess.run([zrec, "sql", "--ballista", f"127.0.0.1:{port}", "SELECT 1"], capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                raise SystemExit(f"cluster did not start: {r.stderr}")
            time.sleep(0.5)
        dist_s, _ = run([zrec, "sql", "--ballista", f"127.0.0.1:{port}", "--partitions", str(a.partitions), copy.format(src=src, out=work / "dist")])

        sys.path.insert(0, str(ROOT / "python"))
        import zrecord

        a_ds, b_ds = zrecord.Dataset(str(work / "single")), zrecord.Dataset(str(work / "dist"))
        assert len(a_ds) == len(b_ds) == rows, (len(a_ds), len(b_ds), rows)
        ctx = zrecord.SessionContext()
        ids = np.random.default_rng(1).integers(0, rows, 2000).tolist()
        lst = ", ".join(map(str, ids))
        qa = ctx.sql(f"SELECT image, label FROM gather('{work / 'single'}', [{lst}])").to_arrow()
        qb = ctx.sql(f"SELECT image, label FROM gather('{work / 'dist'}', [{lst}])").to_arrow()
        assert qa.equals(qb), "distributed root differs from the single-node root"

        mb = nbytes / 1e6
        print(f"{'run':<34}{'seconds':>9}{'MB/s':>9}")
        print(f"{'scan only (single node)':<34}{scan_s:>9.2f}{mb / scan_s:>9.0f}")
        print(f"{'COPY single node, P=' + str(a.partitions):<34}{single_s:>9.2f}{mb / single_s:>9.0f}")
        print(f"{'COPY Ballista, ' + str(a.executors) + ' executors':<34}{dist_s:>9.2f}{mb / dist_s:>9.0f}")
        print(f"ratio Ballista / single node (time): {dist_s / single_s:.2f}x; reading is {scan_s / single_s:.0%} of the single-node COPY")
        print("2000 random records equal in both roots")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

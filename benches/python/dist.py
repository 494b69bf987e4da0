"""Distributed store: per-row get vs get_batch of 256 random ids, 2 and 4 ranks, rows of 3 KB
and 1 MB, ranks on one host (shared memory) and in separate network namespaces (Flight over a
veth link), against mpi4py RMA (Win.Lock / Get / Unlock, the original's method 0) on the same
data in the same layout (one host: MPICH's shared memory; namespaces: its TCP network module),
and a local zrecord store gather of the same rows. Across the namespaces it also measures the
floor of any request/response transport there: one TCP socket, an 8-byte request, the batch's
bytes back (`sendall` / `recv_into` on preallocated buffers).

    python benches/python/dist.py                 # everything this machine allows
    python benches/python/dist.py --quick         # fewer rounds

Rank 0 measures; every figure is from this run. Needs root + iproute2 for the namespace rows
and mpi4py + mpich (`pip install mpi4py mpich`) for the RMA rows; missing ones are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROW_KINDS = {"3KB": (768, 20000), "1MB": (262144, 96)}  # float32 elements per row, rows per rank
BATCH = 256


def rank_rows(kind: str, rank: int) -> np.ndarray:
    elems, rows = ROW_KINDS[kind]
    base = np.arange(rows, dtype=np.float32)[:, None] + rank * rows
    return np.broadcast_to(base, (rows, elems)).copy()


def timeit(fn, rounds):
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def worker(args):
    from zrecord.dist import DistStore

    store = DistStore(None, transport=args.transport, rendezvous=args.dir, rank=args.rank, size=args.size, namespace=args.ns, timeout=60)
    elems, rows = ROW_KINDS[args.kind]
    store.add("x", rank_rows(args.kind, args.rank))
    res = {}
    if args.rank == 0:
        rng = np.random.default_rng(0)
        n = rows * args.size
        # Rows owned by other ranks only: the transport is what is measured.
        remote = np.arange(rows, n)
        ids = [rng.choice(remote, BATCH) for _ in range(args.rounds)]
        out = np.empty((BATCH, elems), np.float32)
        one = np.empty((1, elems), np.float32)
        it = iter(range(10**9))
        t_batch = timeit(lambda: store.get_batch("x", out, ids[next(it) % len(ids)]), args.rounds)
        per_row_n = 64 if args.kind == "3KB" else 16
        t_row = timeit(lambda: [store.get("x", one, int(i)) for i in ids[0][:per_row_n]], max(args.rounds // 4, 3)) / per_row_n
        store.get_batch("x", out, ids[0])
        assert np.array_equal(out[:, 0], ids[0].astype(np.float32)), "rows do not match their ids"
        res = {"batch_us_row": t_batch / BATCH * 1e6, "row_us": t_row * 1e6, "gbps": BATCH * elems * 4 / t_batch / 1e9, "rows_s": BATCH / t_batch}
        # Local store gather of the same rows (same output copy).
        if args.local:
            import zrecord

            p = Path(args.dir) / f"local-{args.kind}"
            if not p.exists():
                with zrecord.DenseWriter(str(p), "float32", (elems,), "raw") as w:
                    for r in range(args.size):
                        w.append(rank_rows(args.kind, r))
            view = zrecord.DenseStore(str(p)).bind(zrecord.Allocator())

            def local():
                b = view.gather(ids[next(it) % len(ids)].astype(np.uint64))
                np.copyto(out, np.from_dlpack(b))

            t_local = timeit(local, args.rounds)
            res["local_us_row"] = t_local / BATCH * 1e6
    store.barrier()
    store.free()
    print(json.dumps(res), flush=True)


def rma_worker(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    elems, rows = ROW_KINDS[args.kind]
    local = rank_rows(args.kind, rank)
    win = MPI.Win.Create(local, disp_unit=elems * 4, comm=comm)
    res = {}
    if rank == 0:
        rng = np.random.default_rng(0)
        n = rows * size
        ids = [rng.choice(np.arange(rows, n), BATCH) for _ in range(args.rounds)]
        out = np.empty((BATCH, elems), np.float32)

        def batched(ix):
            # One lock epoch per target, every row's Get in flight, then unlock (flush).
            owners = ix // rows
            for t in np.unique(owners):
                win.Lock(int(t), MPI.LOCK_SHARED)
                for k in np.nonzero(owners == t)[0]:
                    win.Get([out[k], MPI.FLOAT], int(t), target=int(ix[k] % rows))
                win.Unlock(int(t))

        def per_row(ix):
            for k, i in enumerate(ix):
                t = int(i // rows)
                win.Lock(t, MPI.LOCK_SHARED)
                win.Get([out[k], MPI.FLOAT], t, target=int(i % rows))
                win.Unlock(t)

        it = iter(range(10**9))
        t_batch = timeit(lambda: batched(ids[next(it) % len(ids)]), args.rounds)
        per_row_n = 64 if args.kind == "3KB" else 16
        t_row = timeit(lambda: per_row(ids[0][:per_row_n]), max(args.rounds // 4, 3)) / per_row_n
        res = {"batch_us_row": t_batch / BATCH * 1e6, "row_us": t_row * 1e6}
    comm.Barrier()
    win.Free()
    if rank == 0:
        print(json.dumps(res), flush=True)


def tcp_worker(args):
    """The floor of any request/response transport across the namespaces: one TCP socket,
    an 8-byte request, the batch's bytes back (`sendall` from / `recv_into` a preallocated
    buffer: no framing, no copies in user space)."""
    import socket

    elems, _ = ROW_KINDS[args.kind]
    n = BATCH * elems * 4
    if args.tcp == "server":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("10.78.0.1", 9917))
        s.listen(1)
        print("ready", flush=True)
        c, _ = s.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        src = memoryview(np.ones(n, np.uint8))
        while len(c.recv(8)) == 8:
            c.sendall(src)
        return
    c = socket.create_connection(("10.78.0.1", 9917))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    dst = memoryview(np.empty(n, np.uint8))

    def one():
        c.sendall(b"\0" * 8)
        got = 0
        while got < n:
            got += c.recv_into(dst[got:], n - got)

    t = timeit(one, args.rounds)
    print(json.dumps({"batch_us_row": t / BATCH * 1e6, "gbps": n / t / 1e9}), flush=True)


def run_tcp(kind, rounds, ns_names):
    server = subprocess.Popen(["ip", "netns", "exec", ns_names[0], sys.executable, __file__, "--tcp", "server", "--kind", kind], stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        p = subprocess.run(["ip", "netns", "exec", ns_names[1], sys.executable, __file__, "--tcp", "client", "--kind", kind, "--rounds", str(rounds)], capture_output=True, text=True, timeout=600)
        return json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    finally:
        server.wait(timeout=60)


def netns_setup(tag):
    sh = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    ns = [f"{tag}a", f"{tag}b"]
    for n in ns:
        sh("ip", "netns", "add", n)
    sh("ip", "link", "add", f"{tag}0", "type", "veth", "peer", "name", f"{tag}1")
    for i, n in enumerate(ns):
        sh("ip", "link", "set", f"{tag}{i}", "netns", n)
        sh("ip", "-n", n, "addr", "add", f"10.78.0.{i + 1}/24", "dev", f"{tag}{i}")
        sh("ip", "-n", n, "link", "set", f"{tag}{i}", "up")
        sh("ip", "-n", n, "link", "set", "lo", "up")
    return ns


def netns_teardown(ns):
    for n in ns:
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def run_ranks(kind, size, layout, rounds, ns_names=None, local=False):
    d = tempfile.mkdtemp(prefix="zrdist")
    try:
        procs = []
        for r in range(size):
            prefix = ["ip", "netns", "exec", ns_names[r % 2]] if layout == "netns" else []
            cmd = [*prefix, sys.executable, __file__, "--worker", "--dir", d, "--rank", str(r), "--size", str(size), "--kind", kind, "--rounds", str(rounds), "--ns", "b", "--transport", "auto"]
            if local and r == 0:
                cmd.append("--local")
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=900) for p in procs]
        for p, (o, e) in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError(e[-2000:])
        return json.loads(outs[0][0].strip().splitlines()[-1])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_rma(kind, size, rounds, ns_names=None):
    """mpi4py RMA on one host (MPICH's shared memory), or with ranks alternating between the
    two namespaces (MPMD launch over TCP, as between hosts)."""
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    if mpiexec is None:
        return None
    rank_cmd = [sys.executable, __file__, "--rma-worker", "--kind", kind, "--rounds", str(rounds)]
    env = dict(os.environ)
    if ns_names is None:
        cmd = [mpiexec, "-n", str(size), *rank_cmd]
    else:
        # Keep MPICH off shared memory and CMA (same kernel): its OFI module over TCP, like
        # ranks on separate hosts (UCX_TLS=tcp was slower here on 1 MB rows).
        env.update(MPIR_CVAR_NOLOCAL="1", MPICH_CH4_NETMOD="ofi", FI_PROVIDER="tcp")
        cmd = [mpiexec]
        for r in range(size):
            cmd += [*([":"] if r else []), "-n", "1", "ip", "netns", "exec", ns_names[r % 2], *rank_cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if p.returncode != 0:
        print("mpi4py RMA failed:", p.stderr[-1000:], file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--rma-worker", action="store_true")
    ap.add_argument("--dir")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--size", type=int, default=2)
    ap.add_argument("--kind", default="3KB")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--ns", default="b")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--local", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tcp", choices=["server", "client"])
    args = ap.parse_args()
    if args.tcp:
        return tcp_worker(args)
    if args.worker:
        return worker(args)
    if args.rma_worker:
        return rma_worker(args)
    rounds = 10 if args.quick else 40
    can_ns = os.geteuid() == 0 and shutil.which("ip") is not None
    ns_names = None
    if can_ns:
        try:
            ns_names = netns_setup(f"zb{os.getpid() % 10000}")
        except subprocess.CalledProcessError:
            can_ns = False
    rows = []
    try:
        for kind in ROW_KINDS:
            for size in (2, 4):
                rma = run_rma(kind, size, rounds)
                rma_ns = run_rma(kind, size, rounds, ns_names) if can_ns else None
                same = run_ranks(kind, size, "host", rounds, local=True)
                cross = run_ranks(kind, size, "netns", rounds, ns_names) if can_ns else None
                tcp = run_tcp(kind, rounds, ns_names) if can_ns else None
                rows.append((kind, size, same, cross, rma, rma_ns, tcp))
                print(kind, size, json.dumps({"same": same, "cross": cross, "rma": rma, "rma_ns": rma_ns, "tcp": tcp}), file=sys.stderr, flush=True)
    finally:
        if ns_names:
            netns_teardown(ns_names)
    print("| rows | ranks | layout | get_batch us/row | GB/s | per-row get us | mpi4py RMA batched us/row | RMA per-row us | batched vs RMA | vs local store gather | raw TCP floor us/row |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, size, same, cross, rma_host, rma_ns, tcp in rows:
        for layout, r, rma in (("same host", same, rma_host), ("2 namespaces", cross, rma_ns)):
            if r is None:
                continue
            rma_b = f"{rma['batch_us_row']:.2f}" if rma else "n/a"
            rma_r = f"{rma['row_us']:.1f}" if rma else "n/a"
            ratio = f"{rma['batch_us_row'] / r['batch_us_row']:.1f}x" if rma else "n/a"
            local = f"{r['batch_us_row'] / same['local_us_row']:.2f}x" if layout == "same host" else ""
            floor = f"{tcp['batch_us_row']:.2f}" if tcp and layout != "same host" else ""
            print(f"| {kind} | {size} | {layout} | {r['batch_us_row']:.2f} | {r['gbps']:.2f} | {r['row_us']:.1f} | {rma_b} | {rma_r} | {ratio} | {local} | {floor} |")


if __name__ == "__main__":
    main()

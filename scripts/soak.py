"""Soak a loader: workers + prefetch over a dataset several times larger than the allocator's
pool, for a given time, sampling RSS, open file descriptors and threads. Fails (exit 1) when
any of them grows after warm-up. Usage:

    python scripts/soak.py [--seconds 600] [--records 20000] [--record-bytes 65536]

Prints one line per sample and a summary. The test suite runs the same loop for a fixed
number of batches (tests/python/test_soak.py)."""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

import zrecord as z


def status_kib(field):
    """A `/proc/self/status` memory field (VmRSS, RssAnon, ...) in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def counts():
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def fds_into(root):
    """Open file descriptors of this process on files below `root`. A store opens at most one
    per file of its own, once (the handle for positional reads, taken when its gathers turn
    slow and it switches to cold reads): bounded, not a leak, so the soak counts them apart."""
    root = os.path.realpath(root) + os.sep
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(root):
                n += 1
        except OSError:
            pass
    return n


def build(root, records, record_bytes):
    rng = np.random.default_rng(0)
    with z.DenseWriter(root, "uint8", (record_bytes,), "zstd", level=1) as w:
        for lo in range(0, records, 1000):
            n = min(1000, records - lo)
            w.append(rng.integers(0, 16, size=(n, record_bytes), dtype=np.uint8))


def soak(path, seconds=None, batches=None, pool=64 << 20, workers=2, prefetch=4, batch=64, every=1000, report=print):
    """Run the loader, sampling every `every` batches (few enough that the samples themselves
    do not show up as growth); returns (samples, leaks) where leaks lists what grew."""
    store = z.DenseStore(path)
    alloc = z.Allocator(pool_size_bytes=pool)
    view = store.bind(alloc)
    samples = []
    leaks = []
    store_files = sum(len(fs) for _, _, fs in os.walk(path))
    t0 = time.monotonic()
    n = 0
    with z.Loader({"x": [view]}, z.Sampler(len(store), batch, "iid", seed=1), workers=workers, prefetch=prefetch) as loader:
        for parts in loader:
            x = parts[0]["x"] if isinstance(parts, list) else parts
            del x, parts
            n += 1
            if n % every == 0:
                fds, threads = counts()
                own = fds_into(path)
                if own > store_files:
                    leaks.append(f"{own} descriptors open on the store's {store_files} files")
                # The store's own handles are bounded (checked above): the rest must stay flat.
                s = (time.monotonic() - t0, n, status_kib("VmRSS"), status_kib("RssAnon"), fds - own, threads, alloc.stats()["live_bytes"])
                samples.append(s)
                report("t=%7.1fs batches=%7d rss=%7d KiB anon=%7d KiB fds=%3d threads=%3d live=%d" % s)
            if (seconds is not None and time.monotonic() - t0 >= seconds) or (batches is not None and n >= batches):
                break
    warm = samples[len(samples) // 4 :] if len(samples) >= 4 else samples
    if warm:
        first, last = warm[0], warm[-1]
        peak_anon = max(s[3] for s in warm)
        if peak_anon > first[3] + 32 * 1024:
            leaks.append(f"anonymous memory grew {first[3]} -> {peak_anon} KiB after warm-up")
        # A slow leak: the mean of the last third against the mean of the first third after
        # warm-up (batches in flight and pooled regions make single samples vary by MiBs).
        k = max(1, len(warm) // 3)
        early, late = sum(s[3] for s in warm[:k]) / k, sum(s[3] for s in warm[-k:]) / k
        if len(warm) >= 6 and late - early > 4 * 1024:
            leaks.append(f"anonymous memory creeps up: {early:.0f} -> {late:.0f} KiB (mean of first / last third)")
        if last[4] > first[4]:
            leaks.append(f"file descriptors grew {first[4]} -> {last[4]}")
        if last[5] > first[5]:
            leaks.append(f"threads grew {first[5]} -> {last[5]}")
    return samples, leaks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--record-bytes", type=int, default=64 << 10)
    ap.add_argument("--pool", type=int, default=64 << 20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s")
        build(path, a.records, a.record_bytes)
        size = a.records * a.record_bytes
        print(f"dataset {size >> 20} MiB decoded, pool {a.pool >> 20} MiB ({size / a.pool:.1f}x)")
        fds0, th0 = counts()
        samples, leaks = soak(path, seconds=a.seconds, pool=a.pool)
        first = samples[len(samples) // 4]
        print(f"after warm-up: anon {first[3]} -> {samples[-1][3]} KiB (peak {max(s[3] for s in samples[len(samples) // 4:])}), rss {first[2]} -> {samples[-1][2]} KiB")
        fds1, th1 = counts()
        print(f"after close: fds {fds0} -> {fds1}, threads {th0} -> {th1}")
        if fds1 > fds0 or th1 > th0:
            leaks.append("descriptors or threads left after close")
        print("LEAKS: " + "; ".join(leaks) if leaks else f"ok: flat over {samples[-1][1]} batches in {samples[-1][0]:.0f} s")
        sys.exit(1 if leaks else 0)


if __name__ == "__main__":
    main()

"""Load and concurrency: a loader over a dataset larger than its pool stays flat (memory, fds,
threads) over many batches; gathers racing a close get valid data or a typed error; a loader
closed from another thread while iterating stops promptly."""

import importlib.util
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import zrecord as z

spec = importlib.util.spec_from_file_location("soak", Path(__file__).parents[2] / "scripts" / "soak.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


def test_loader_soak_is_flat(tmp_path):
    path = tmp_path / "s"
    soak.build(path, 4000, 16 << 10)  # 62.5 MiB decoded, 4x the 16 MiB pool
    fds0, th0 = soak.counts()
    samples, leaks = soak.soak(path, batches=1500, pool=16 << 20, every=50, report=lambda *_: None)
    assert len(samples) == 30
    assert not leaks, leaks
    assert all(s[6] <= 64 << 20 for s in samples), "live pooled bytes stay bounded by the window"
    fds1, th1 = soak.counts()
    assert fds1 <= fds0 and th1 <= th0, (fds0, fds1, th0, th1)


def test_gathers_racing_a_store_close(tmp_path):
    data = np.arange(512 * 64, dtype=np.int64).reshape(512, 64)
    with z.DenseWriter(tmp_path / "s", "int64", (64,), "zstd") as w:
        w.append(data)
    store = z.DenseStore(tmp_path / "s")
    view = store.bind(z.Allocator())
    results = {"ok": 0, "closed": 0}
    lock = threading.Lock()
    start = threading.Barrier(17)

    def gather(seed):
        rng = np.random.default_rng(seed)
        start.wait()
        for _ in range(200):
            ids = rng.integers(0, 512, 32)
            try:
                got = np.from_dlpack(view.gather(ids))
            except ValueError as e:
                assert "closed" in str(e)
                with lock:
                    results["closed"] += 1
                continue
            assert np.array_equal(got, data[ids])
            with lock:
                results["ok"] += 1

    threads = [threading.Thread(target=gather, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    start.wait()
    store.close()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert results["ok"] + results["closed"] == 16 * 200
    with pytest.raises(ValueError, match="closed"):
        view.gather([0])


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_closed_from_another_thread_while_iterating(tmp_path, workers):
    with z.DenseWriter(tmp_path / "s", "uint8", (4096,), "raw") as w:
        w.append(np.zeros((256, 4096), np.uint8))
    view = z.DenseStore(tmp_path / "s").bind(z.Allocator())
    loader = z.Loader({"x": [view]}, z.Sampler(256, 8, "iid"), workers=workers, transform=lambda p: len(p))
    seen = []
    first = threading.Event()

    def consume():
        for b in loader:
            seen.append(b)
            first.set()

    t = threading.Thread(target=consume)
    t.start()
    assert first.wait(60)
    loader.close()
    t.join(timeout=30)
    assert not t.is_alive(), "iteration did not stop after close()"
    assert loader.closed and len(seen) >= 1

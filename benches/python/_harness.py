"""Shared bench harness: a timing loop over fresh batches and peak PSS of a process tree.
It imports nothing of zrecord, so the loaderx interpreter (Python >= 3.12) uses it too."""

import os
import threading
import time


MEM_FIELDS = ("Pss", "Pss_Anon", "Pss_File")


def mem_tree(pid):
    """{Pss, Pss_Anon, Pss_File} in bytes summed over `pid` and its children (smaps_rollup):
    anonymous memory (the loader's own buffers) and mapped file pages (the dataset) apart."""
    total = dict.fromkeys(MEM_FIELDS, 0)
    pids = [pid]
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                pids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in total:
                        total[key] += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def pss_tree(pid):
    return mem_tree(pid)["Pss"]


class PeakPss:
    """Peak PSS of a process tree (`peak`), and the peaks of its anonymous and file-backed
    parts (`peaks["Pss_Anon"]`, `peaks["Pss_File"]`), sampled every 10 ms."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, False
        self.peaks = dict.fromkeys(MEM_FIELDS, 0)
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop:
            m = mem_tree(self.pid)
            for k, v in m.items():
                self.peaks[k] = max(self.peaks[k], v)
            self.peak = self.peaks["Pss"]
            time.sleep(0.01)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop = True
        self.t.join()


def measure(fn, batches, seconds):
    """Seconds per call of fn(batch), cycling through `batches` for at least `seconds`."""
    fn(batches[0])  # warm
    t0 = time.perf_counter()
    k = 0
    while True:
        fn(batches[k % len(batches)])
        k += 1
        if k % 8 == 0 and time.perf_counter() - t0 >= seconds:
            break
    return (time.perf_counter() - t0) / k


def measure_rounds(fns, batches, seconds, rounds=8):
    """{name: seconds per call} for every fn in `fns`, measured in `rounds` interleaved slices
    of seconds / rounds each (every system in turn, round after round) and reduced to each
    system's median slice: a machine whose memory speed drifts over seconds (a shared VM)
    shifts every system alike instead of whichever ran during a slow spell."""
    per = {name: [] for name in fns}
    for fn in fns.values():
        fn(batches[0])  # warm
    k = 0
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            n = 0
            while True:
                fn(batches[k % len(batches)])
                k += 1
                n += 1
                if n % 8 == 0 and time.perf_counter() - t0 >= seconds / rounds:
                    break
            per[name].append((time.perf_counter() - t0) / n)
    return {name: sorted(v)[len(v) // 2] for name, v in per.items()}


def drop_cache(*paths):
    """Ask the kernel to drop the page-cache pages of every file under `paths` (pages still
    mapped by a process stay: release mappings first)."""
    for top in paths:
        files = [top] if os.path.isfile(top) else [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs]
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def measure_cold(fn, evict, batches, seconds, max_batches=400):
    """Seconds per call of fn(batch) with evict() run (untimed) before every call, so each
    batch starts with the data out of memory."""
    evict()
    fn(batches[0])  # warm the code paths (not the data)
    total, k = 0.0, 0
    while k < max_batches and (k < 8 or total < seconds):
        evict()
        t = time.perf_counter()
        fn(batches[(k + 1) % len(batches)])
        total += time.perf_counter() - t
        k += 1
    return total / k


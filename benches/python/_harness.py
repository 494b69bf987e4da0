"""Shared bench harness: a timing loop over fresh batches and peak PSS of a process tree.
It imports nothing of zrecord, so the loaderx interpreter (Python >= 3.12) uses it too."""

import os
import threading
import time


def pss_tree(pid):
    total = 0
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
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class PeakPss:
    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, False
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, pss_tree(self.pid))
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

"""Measure the PyPI `loaderx` gather on one workload (run under Python >= 3.12 by compare.py).

    python3.12 loaderx_gather.py DATA.npz WORKDIR SECONDS BATCH [cold]
Prints one JSON line {"loaderx <codec>": [class, seconds_per_batch], ...}.
"""

import json
import os
import sys

import numpy as np
from loaderx import Allocator
from _harness import drop_cache, measure, measure_cold  # same directory: on sys.path when run as a script
from loaderx.zrecord import DenseStore, DenseWriter, RaggedBatch, RaggedStore, RaggedWriter, train_dict


def main():
    data_path, root, seconds, batch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    cold = sys.argv[5:] == ["cold"]
    z = np.load(data_path)
    dense = "data" in z
    name = os.path.basename(data_path)[3:-4]
    rng = np.random.default_rng(1)
    out = {}
    with Allocator("cpu") as alloc:
        if dense:
            data = z["data"]
            n = len(data)
        else:
            values, cu = z["values"], z["cu"]
            n = len(cu) - 1
            shapes = np.diff(cu).astype(np.uint32).reshape(-1, 1)  # loaderx 2.8 takes uint32 shapes
        batches = [rng.integers(0, n, batch) for _ in range(4096)]
        sample_dir = os.path.join(root, f"lx-{name}-sample")
        if dense:
            with DenseWriter(sample_dir, data.dtype, data.shape[1:], codec="raw") as w:
                w.append(data[: min(n, 4000)])
            with DenseStore(sample_dir) as s:
                d = train_dict(s.bind(alloc))
        else:
            m = min(n, 4000)
            with RaggedWriter(sample_dir, values.dtype, ndim=1, codec="raw") as w:
                w.append(RaggedBatch(values[: cu[m]], cu[: m + 1], shapes[:m]))
            with RaggedStore(sample_dir) as s:
                d = train_dict(s.bind(alloc))
        for codec in ("raw", "zstd", "zstd_dict"):
            p = os.path.join(root, f"lx-{name}-{codec}")
            kw = {"dict_bytes": d} if codec == "zstd_dict" else {}
            if dense:
                with DenseWriter(p, data.dtype, data.shape[1:], codec=codec, **kw) as w:
                    w.append(data)
                store = DenseStore(p)
                view = store.bind(alloc)
                fn = lambda ids, v=view: np.from_dlpack(v[ids])  # noqa: E731
                np.testing.assert_array_equal(fn(batches[0]), data[batches[0]])
            else:
                with RaggedWriter(p, values.dtype, ndim=1, codec=codec, **kw) as w:
                    w.append(RaggedBatch(values, cu, shapes))
                store = RaggedStore(p)
                view = store.bind(alloc)
                fn = lambda ids, v=view: np.from_dlpack(v[ids].values)  # noqa: E731
                want = np.concatenate([values[cu[i]:cu[i + 1]] for i in batches[0]])
                np.testing.assert_array_equal(fn(batches[0]), want)
            if cold:
                # Reopened after every eviction, so no mapping of its files survives.
                state = {"store": store, "view": view}
                Store = DenseStore if dense else RaggedStore

                def evict(state=state, p=p, Store=Store):
                    state["store"].close()
                    drop_cache(p)
                    state["store"] = Store(p)
                    state["view"] = state["store"].bind(alloc)

                if dense:
                    fn = lambda ids, s=state: np.from_dlpack(s["view"][ids])  # noqa: E731
                else:
                    fn = lambda ids, s=state: np.from_dlpack(s["view"][ids].values)  # noqa: E731
                t = measure_cold(fn, evict, batches, seconds)
                store = state["store"]
            else:
                t = measure(fn, batches, seconds)
            out[f"loaderx {codec}"] = ["raw" if codec == "raw" else "compressed", t]
            store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

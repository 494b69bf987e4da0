"""Zarr batch assembly: crops and index queries from Zarr v3 / v2 arrays into pooled tensors.

Sources are Zarr v3 arrays (sharded with ``sharding_indexed`` or not; codecs bytes, zstd,
blosc, gzip, crc32c, transpose), Zarr v2 arrays (C or F order; compressor none / zstd / blosc /
gzip) and NGFF (OME-Zarr) multiscale images (a group URI plus ``level``). Missing chunks, missing
shards and empty shard entries read as the fill value; so do the parts of a crop that reach past
the array.

>>> import numpy as np, zrecord.zarr as zz                          # doctest: +SKIP
>>> with zz.Pipeline(output=zz.BatchSpec(samples=2, shape=(16, 64, 64), dtype="f32")) as p:
...     p.push(zz.Sample(uri, [(0, 16), (0, 64), (0, 64)]) for _ in range(2))
...     with p.pop() as batch:
...         x = np.from_dlpack(batch)                             # zero-copy

``read(uri)`` returns a whole array; ``CropSource`` makes crops a record source for ``Loader``
and SQL (``zarr_crops('uri', [16, 64, 64], 1000, seed)`` in a ``SessionContext``).
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import atexit
import itertools
import weakref

from ._zrecord import _ZarrPipeline, _ZarrReader

# Pipelines still open at interpreter exit are closed first, so no worker thread reaches for a
# generator while Python shuts down.
_LIVE: "weakref.WeakSet[Pipeline]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for p in list(_LIVE):
        try:
            p.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass

__all__ = [
    "Sample",
    "IndexQuery",
    "BatchSpec",
    "Limits",
    "CacheLimits",
    "QueueLimits",
    "Pipeline",
    "Batch",
    "CropSource",
    "read",
    "gather",
    "info",
    "reader",
]

_DTYPES = {"same": None, "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}


def _dtype(d: Any) -> Any:
    if isinstance(d, str):
        return _DTYPES.get(d, d)
    return d


def _int(v: Any, what: str) -> int:
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(v).__name__}") from None


def _uri(uri: Any) -> str:
    import os

    if isinstance(uri, os.PathLike):
        return os.fspath(uri)
    if not isinstance(uri, str):
        raise TypeError(f"uri must be a str or path, got {type(uri).__name__}")
    return uri


class Sample:
    """A crop: ``aabb`` is one half-open ``(start, stop)`` range per axis (or ``np.s_[a:b, ...]``
    with explicit ends). Parts outside the array read as the fill value."""

    __slots__ = ("uri", "aabb", "level")

    def __init__(self, uri: Any, aabb: Any, level: int | None = None) -> None:
        self.uri = _uri(uri)
        self.level = None if level is None else _int(level, "level")
        if isinstance(aabb, slice):
            aabb = (aabb,)
        ranges = []
        for axis, r in enumerate(aabb):
            if isinstance(r, slice):
                if r.start is None or r.stop is None or r.step not in (None, 1):
                    raise ValueError(f"axis {axis}: a Sample slice needs explicit start and stop and step 1, got {r}")
                a, b = _int(r.start, "start"), _int(r.stop, "stop")
            else:
                try:
                    a, b = r
                except (TypeError, ValueError):
                    raise TypeError(f"axis {axis}: expected a (start, stop) pair or a slice, got {r!r}") from None
                a, b = _int(a, "start"), _int(b, "stop")
            if b < a:
                raise ValueError(f"axis {axis}: range ({a}, {b}) has stop < start")
            ranges.append((a, b))
        self.aabb = tuple(ranges)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.aabb)

    def _query(self) -> tuple:
        return (self.uri, self.level, [("range", a, b) for a, b in self.aabb])

    def __repr__(self) -> str:
        return f"Sample({self.uri!r}, {list(self.aabb)!r}" + (f", level={self.level})" if self.level is not None else ")")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sample) and (self.uri, self.aabb, self.level) == (other.uri, other.aabb, other.level)


class IndexQuery:
    """Per-axis index arrays and slices (NumPy semantics: negative indices count from the end,
    slices are clipped); the output is the outer product of the axes' selections, in order,
    duplicates kept. An integer selects one position and keeps the axis (length 1)."""

    __slots__ = ("uri", "selection", "level", "_axes")

    def __init__(self, uri: Any, selection: Any, level: int | None = None) -> None:
        self.uri = _uri(uri)
        self.level = None if level is None else _int(level, "level")
        if not isinstance(selection, tuple):
            selection = (selection,)
        axes = []
        for axis, s in enumerate(selection):
            if isinstance(s, slice):
                step = 1 if s.step is None else _int(s.step, "step")
                if step == 0:
                    raise ValueError(f"axis {axis}: slice step cannot be zero")
                start = None if s.start is None else _int(s.start, "start")
                stop = None if s.stop is None else _int(s.stop, "stop")
                axes.append(("slice", start, stop, step))
            elif isinstance(s, numbers.Integral) or hasattr(s, "__index__") and not hasattr(s, "__len__"):
                axes.append(("index", [_int(s, "index")]))
            else:
                try:
                    import numpy as np

                    arr = np.asarray(s)
                except Exception:  # pragma: no cover - numpy is a dependency
                    arr = None
                if arr is not None:
                    if arr.ndim != 1:
                        raise ValueError(f"axis {axis}: index arrays must be 1-d, got shape {arr.shape}")
                    if arr.size and arr.dtype.kind not in "iu":
                        raise TypeError(f"axis {axis}: index arrays must hold integers, got {arr.dtype}")
                    axes.append(("index", [int(v) for v in arr.tolist()]))
                else:
                    axes.append(("index", [_int(v, "index") for v in s]))
        self.selection = selection
        self._axes = axes

    @property
    def shape(self) -> tuple[int, ...]:
        """Output shape. A slice with an open or negative end (``[:, -64:]``) is resolved
        against the array's shape, read once from its metadata (the module's shared reader
        caches it); ``shape_in`` computes it for a given array shape without any read."""
        out = []
        for a in self._axes:
            if a[0] == "index":
                out.append(len(a[1]))
            else:
                _, start, stop, step = a
                if start is None or stop is None or start < 0 or stop < 0:
                    return self.shape_in(info(self.uri, self.level)["shape"])
                out.append(len(range(start, stop, step)))
        return tuple(out)

    def shape_in(self, array_shape: Sequence[int]) -> tuple[int, ...]:
        """Output shape for an array of ``array_shape``."""
        out = []
        for a, dim in zip(self._axes, array_shape):
            if a[0] == "index":
                out.append(len(a[1]))
            else:
                out.append(len(range(*slice(a[1], a[2], a[3]).indices(dim))))
        return tuple(out)

    def _query(self) -> tuple:
        return (self.uri, self.level, self._axes)

    def __repr__(self) -> str:
        return f"IndexQuery({self.uri!r}, {self.selection!r})"


def _query(q: Any) -> tuple:
    if isinstance(q, (Sample, IndexQuery)):
        return q._query()
    raise TypeError(f"expected a zrecord.zarr.Sample or IndexQuery, got {type(q).__name__}")


@dataclass(frozen=True)
class BatchSpec:
    """``samples`` per batch of ``shape``, cast to ``dtype`` (``"same"``: the source type;
    ``"f32"``, ``"bf16"``, ``"f16"``, or an integer type that holds every source value)."""

    samples: int
    shape: tuple[int, ...]
    dtype: Any = "same"


@dataclass(frozen=True)
class Limits:
    """Executor limits: decode workers (0: one per core), the largest merged read, the largest
    decoded chunk, and the hard memory budget (output slots + read buffers + decode scratch)."""

    decode_workers: int = 0
    max_read_bytes: int = 16 << 20
    max_chunk_bytes: int = 16 << 20
    max_memory_bytes: int = 2 << 30


@dataclass(frozen=True)
class CacheLimits:
    """Bounded LRU caches: opened arrays, shard indexes, and decoded chunks kept across batches
    (``chunk_cache_bytes``, 0 = off; it counts toward the pipeline's memory budget)."""

    array_entries: int = 256
    shard_index_entries: int = 8192
    chunk_cache_bytes: int = 0


@dataclass(frozen=True)
class QueueLimits:
    """Samples pulled ahead, and batches assembled ahead (output slots)."""

    lookahead_samples: int = 64
    prepared_batches: int = 2


def _limits(limits: Limits | None, cache: CacheLimits | None) -> dict:
    d: dict = {}
    if limits is not None:
        d.update(decode_workers=limits.decode_workers, max_read_bytes=limits.max_read_bytes, max_chunk_bytes=limits.max_chunk_bytes, max_memory_bytes=limits.max_memory_bytes)
    if cache is not None:
        d.update(array_entries=cache.array_entries, shard_index_entries=cache.shard_index_entries, chunk_cache_bytes=cache.chunk_cache_bytes)
    return d


class Batch:
    """One assembled batch ``[n, *shape]``: a DLPack producer and Arrow array. Use it as a
    context manager (or call ``release()``) to hand its slot back; arrays made from it keep
    the slot busy until they are gone (``.copy()`` what you keep)."""

    __slots__ = ("_t", "_p", "index", "shape", "dtype")

    def __init__(self, tensor: Any, index: int, pipeline: Any) -> None:
        self._t = tensor
        self._p = pipeline
        self.index = index
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype

    def _live(self) -> Any:
        if self._t is None:
            raise ValueError(f"batch {self.index} was released")
        return self._t

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._live().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self._live().__arrow_c_array__(requested_schema)

    def __len__(self) -> int:
        return self.shape[0]

    def numpy(self) -> Any:
        import numpy as np

        return np.from_dlpack(self._live())

    def release(self) -> None:
        if self._t is not None:
            self._t = None
            self._p.notify_released()

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Batch(index={self.index}, shape={self.shape}, dtype={self.dtype}{', released' if self._t is None else ''})"


class Pipeline:
    """Streams batches assembled from pushed samples.

    ``push(iterable)`` takes lists and (infinite) generators, pulled lazily as slots free;
    ``pop(timeout=None)`` returns the next ``Batch``; ``batches(n)`` yields ``n`` of them;
    ``finish()`` says no more pushes come (a shorter tail becomes a last batch); ``close()``
    (or leaving the ``with`` block) stops at once, dropping queued work. Errors name the sample
    and URI and are sticky: every later ``pop`` raises them again. The memory budget
    (``limits.max_memory_bytes``) must hold ``queues.prepared_batches`` batches plus the
    workers' read buffers and decode scratch, or construction fails.
    """

    def __init__(self, output: BatchSpec, limits: Limits | None = None, queues: QueueLimits | None = None, cache: CacheLimits | None = None) -> None:
        if not isinstance(output, BatchSpec):
            raise TypeError("output must be a zrecord.zarr.BatchSpec")
        queues = queues or QueueLimits()
        self.output = output
        samples, shape = _int(output.samples, "samples"), [_int(s, "shape") for s in output.shape]
        limits_d = _limits(limits or Limits(), cache)
        lookahead, prepared = _int(queues.lookahead_samples, "lookahead_samples"), _int(queues.prepared_batches, "prepared_batches")
        # dtype "same": the batches take the type of the first pushed sample's array, so the
        # native pipeline (whose batch slots are sized by the type) starts at the first push.
        self._make = lambda dtype: _ZarrPipeline(samples, shape, dtype, limits_d, lookahead, prepared)
        self._finished = False
        self._closed = False
        self._dtype = _dtype(output.dtype)
        self._p = None if self._dtype is None else self._make(self._dtype)
        _LIVE.add(self)

    def _start(self, first: Any) -> None:
        if self._closed:
            raise ValueError("the pipeline is closed")
        if not isinstance(first, (Sample, IndexQuery)):
            _query(first)  # the TypeError naming what was pushed
        self._dtype = info(first.uri, first.level)["dtype"]
        self._p = self._make(self._dtype)
        if self._finished:
            self._p.finish()

    def push(self, samples: Iterable[Any]) -> None:
        if isinstance(samples, (Sample, IndexQuery)):
            samples = [samples]
        if isinstance(samples, (list, tuple)):
            queries = [_query(q) for q in samples]  # finite: checked now
            if self._p is None:
                if not samples:
                    return
                self._start(samples[0])
            self._p.push(queries)
        else:
            if self._p is None:
                it = iter(samples)
                for first in it:
                    self._start(first)
                    samples = itertools.chain([first], it)
                    break
                else:
                    return
            self._p.push(map(_query, samples))  # pulled lazily; a bad item becomes the pipeline's error

    @property
    def dtype(self) -> str | None:
        """The batches' element type (``None`` until the first push when the spec says "same")."""
        return self._dtype

    def finish(self) -> None:
        self._finished = True
        if self._p is not None:
            self._p.finish()

    def pop(self, timeout: float | None = None) -> Batch:
        if self._p is None:
            if self._closed:
                raise ValueError("the pipeline is closed")
            raise ValueError("no samples pending: nothing was pushed yet")
        t, i = self._p.pop(timeout)
        return Batch(t, i, self._p)

    def batches(self, n: int | None = None):
        """Yield ``n`` batches (all that can be made when ``None``; pair with ``finish()``)."""
        k = 0
        while n is None or k < n:
            try:
                b = self.pop()
            except ValueError as e:
                if n is None and "no samples pending" in str(e):
                    return
                raise
            yield b
            k += 1

    def stats(self) -> dict:
        """Per-stage counters: samples, batches, reads, bytes_read, selected_bytes,
        read_amplification, chunks_decoded, chunks_filled, decode/read/assemble seconds,
        cache hits and misses."""
        if self._p is None:
            return {}
        return self._p.stats()

    def close(self) -> None:
        self._closed = True
        if self._p is not None:
            self._p.close()

    @property
    def closed(self) -> bool:
        return self._closed if self._p is None else self._p.closed

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_reader: Any = None


def reader(limits: Limits | None = None, cache: CacheLimits | None = None) -> Any:
    """A reader with its own limits and caches: ``.read(uri)``, ``.gather(queries)``,
    ``.info(uri)``, ``.stats()`` (module-level ``read`` / ``gather`` share a default one)."""
    return _Reader(_ZarrReader(_limits(limits, cache)))


class _Reader:
    __slots__ = ("_r",)

    def __init__(self, r: Any) -> None:
        self._r = r

    def read(self, uri: Any, level: int | None = None, dtype: Any = "same", allocator: Any = None) -> Any:
        return self._r.read(_uri(uri), level, _dtype(dtype), allocator)

    def gather(self, queries: Iterable[Any], dtype: Any = "same", allocator: Any = None) -> Any:
        return self._r.gather([_query(q) for q in queries], _dtype(dtype), allocator)

    def info(self, uri: Any, level: int | None = None) -> dict:
        return self._r.info(_uri(uri), level)

    def stats(self) -> dict:
        return self._r.stats()


def _default_reader() -> Any:
    global _reader
    if _reader is None:
        _reader = _ZarrReader()
    return _reader


def read(uri: Any, level: int | None = None, dtype: Any = "same", allocator: Any = None) -> Any:
    """The whole array (v2 or v3, any supported layout) in one allocation, chunks decoded in
    parallel straight into place. Returns a DLPack tensor (``np.from_dlpack`` it)."""
    return _default_reader().read(_uri(uri), level, _dtype(dtype), allocator)


def gather(queries: Iterable[Any], dtype: Any = "same", allocator: Any = None) -> Any:
    """One batch ``[n, *shape]`` of samples / index queries, without a pipeline."""
    return _default_reader().gather([_query(q) for q in queries], _dtype(dtype), allocator)


def info(uri: Any, level: int | None = None) -> dict:
    """Shape, (read) chunk shape, dtype, Zarr format and whether the array is sharded."""
    return _default_reader().info(_uri(uri), level)


class CropSource:
    """Crops of one array as a record source: record ``i`` is crop ``i``.

    Either ``crops=[aabb, ...]`` (every crop one extent; past the edges reads the fill value)
    or ``shape=(...)`` with ``count`` and ``seed`` (crop ``i`` placed uniformly inside the array,
    a function of ``(seed, i)`` only). ``bind(allocator)`` gives a view the ``Loader``,
    ``ArrowLoader`` and ``SessionContext.register_sources`` take.
    """

    def __init__(self, uri: Any, crops: Sequence[Any] | None = None, *, shape: Sequence[int] | None = None, count: int | None = None, seed: int = 0, level: int | None = None, dtype: Any = "same") -> None:
        self.uri = _uri(uri)
        self.level = level
        self.dtype = _dtype(dtype)
        if crops is not None:
            self.crops = [Sample(self.uri, c).aabb for c in crops]
        else:
            self.crops = None
        self.shape = None if shape is None else tuple(_int(s, "shape") for s in shape)
        self.count = None if count is None else _int(count, "count")
        self.seed = _int(seed, "seed")
        self._default = self.bind(None)

    def bind(self, allocator: Any = None) -> Any:
        from . import Allocator

        alloc = allocator if allocator is not None else Allocator()
        return _default_reader().crops(self.uri, alloc, self.level, [list(c) for c in self.crops] if self.crops is not None else None, self.shape, self.count, self.seed, self.dtype)

    def __len__(self) -> int:
        return len(self._default)

    def __getitem__(self, key: Any) -> Any:
        return self._default[key]

    def gather(self, ids: Any) -> Any:
        return self._default.gather(ids)

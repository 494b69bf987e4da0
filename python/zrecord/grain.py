"""Grain adapter: :class:`DataSource` is a Grain ``RandomAccessDataSource`` (``__len__``,
``__getitem__``, ``__getitems__``) over a store, view, dataset root or dict of aligned streams.

Records come back as NumPy arrays (a dict per record when there are several streams, ``str`` /
``bytes`` for utf8 / binary records). ``__getitems__`` gathers the whole batch in one call per
stream and returns per-record views of it. The source pickles as paths and options, so Grain's
worker processes reopen the stores.

>>> import grain
>>> ds = grain.MapDataset.source(zrecord.grain.DataSource("tokens.zrec")).batch(32, batch_fn=zrecord.grain.ragged_batch)  # doctest: +SKIP

Grain's default batching stacks records, which fails for ragged streams (records of different
shapes): :func:`ragged_batch` is the ``batch_fn`` that packs them instead.

:class:`EpochSampler` is a Grain sampler over :class:`zrecord.EpochPlan` (the epoch arithmetic
the PyTorch adapter and the JAX example use): each of Grain's data shards reads its deal's
batches, epoch after epoch, and ``position_after`` resumes on another shard count.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _zrecord as _z
from ._sources import streams_of, text_records

__all__ = ["DataSource", "EpochSampler", "ragged_batch"]


def _records(batch: Any, logical: str) -> list:
    if isinstance(batch, _z.RaggedBatch):
        if logical in ("utf8", "binary"):
            return text_records(batch, logical)
        values = np.from_dlpack(batch.values)
        offsets = np.from_dlpack(batch.cu_seqlens).tolist()
        shapes = np.from_dlpack(batch.shapes).tolist()
        return [values[a:b].reshape(shape) for a, b, shape in zip(offsets[:-1], offsets[1:], shapes)]
    return list(np.from_dlpack(batch))


class DataSource:
    """Random access to zrecord records for Grain (and anything else that wants
    ``len`` / ``[i]`` / ``__getitems__``)."""

    def __init__(self, source: Any, *, streams: list[str] | None = None, allocator: Any = None, verify_checksums: bool = True) -> None:
        self.streams, self.single = streams_of(source, streams, allocator, verify_checksums)
        self._len = len(next(iter(self.streams.values())))

    def __len__(self) -> int:
        return self._len

    def _index(self, i: Any) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"record keys are ints, got {type(i).__name__}")
        i = int(i)
        if i < -self._len or i >= self._len:
            raise IndexError(f"record {i} is out of range for {self._len} records")
        return i + self._len if i < 0 else i

    def __getitem__(self, record_key: int) -> Any:
        return self.__getitems__([record_key])[0]

    def __getitems__(self, record_keys: Sequence[int]) -> list:
        ids = np.fromiter((self._index(k) for k in record_keys), dtype=np.uint64, count=len(record_keys))
        cols = {name: _records(v.gather(ids), getattr(v, "logical", "tensor")) for name, v in self.streams.items()}
        if self.single:
            return cols["data"]
        names = list(cols)
        return [{name: cols[name][k] for name in names} for k in range(len(ids))]

    def __repr__(self) -> str:
        return f"zrecord.grain.DataSource({self._len} records, streams={list(self.streams)})"


def _batch(items: list, pad_value: Any) -> Any:
    if isinstance(items[0], (str, bytes)):
        return list(items)
    arrs = [np.asarray(x) for x in items]
    first = arrs[0]
    if all(a.shape == first.shape and a.dtype == first.dtype for a in arrs):
        return np.stack(arrs)
    if any(a.ndim != first.ndim for a in arrs):
        raise ValueError(f"records of one field have different ndims: {sorted({a.ndim for a in arrs})}")
    dtype = np.result_type(*arrs)
    shapes = np.array([a.shape for a in arrs], dtype=np.uint64).reshape(len(arrs), first.ndim)
    if pad_value is None:
        sizes = np.array([a.size for a in arrs], dtype=np.int64)
        if sizes.sum() > np.iinfo(np.int32).max:
            raise ValueError(f"a packed batch holds {int(sizes.sum())} values, more than int32 cu_seqlens address")
        cu = np.zeros(len(arrs) + 1, dtype=np.int32)
        np.cumsum(sizes, out=cu[1:])
        values = np.concatenate([a.reshape(-1) for a in arrs]).astype(dtype, copy=False) if arrs else np.zeros(0, dtype)
        return {"values": values, "cu_seqlens": cu, "shapes": shapes}
    top = shapes.max(axis=0).astype(np.int64) if len(arrs) else np.zeros(first.ndim, np.int64)
    out = np.full((len(arrs), *top.tolist()), pad_value, dtype=dtype)
    for k, a in enumerate(arrs):
        out[(k, *(slice(0, d) for d in a.shape))] = a
    return {"values": out, "shapes": shapes}


def ragged_batch(elements: Sequence[Any], pad_value: Any = None) -> Any:
    """A Grain ``batch_fn`` (``MapDataset.batch(n, batch_fn=zrecord.grain.ragged_batch)``) for
    records of different shapes. Per field (or for the records themselves, one stream): records
    of one shape and dtype are stacked as Grain does; ``str`` / ``bytes`` records stay a list;
    records of different shapes are packed like :class:`zrecord.RaggedBatch`:
    ``{"values": 1-D concatenation, "cu_seqlens": int32 [n + 1] offsets into values,
    "shapes": uint64 [n, ndim]}``. With ``pad_value`` (``functools.partial(ragged_batch,
    pad_value=0)``) they are padded instead: ``{"values": [n, *max shape] filled with
    pad_value, "shapes": uint64 [n, ndim]}``."""
    if not len(elements):
        raise ValueError("ragged_batch got no records")
    first = elements[0]
    if isinstance(first, dict):
        return {k: _batch([e[k] for e in elements], pad_value) for k in first}
    return _batch(list(elements), pad_value)


class EpochSampler:
    """A Grain ``Sampler`` whose order is a :class:`zrecord.EpochPlan` dealt to ``shard_count``
    data shards (Grain's ``ShardOptions``: one shard per process): shard ``s`` reads its deal's
    batches of ``batch_size`` records, one epoch after another, ``num_epochs`` epochs. Grain
    gives every shard the same number of records, so the plan drops what does not fill a whole
    round of full batches (``drop_last``: the partial batch and at most ``shard_count - 1``
    batches per epoch, or per resumed epoch). With ``operations=[grain.transforms.Batch(
    batch_size)]`` and in-order reading (``worker_count=0``) Grain's batches are the plan's.

    ``position`` resumes from :meth:`position_after` of a run on any other shard count (elastic
    resumption: no record twice, none skipped but for that last incomplete round). Grain's
    ``_SamplerMapDataset`` asks shard ``s`` for global indices ``i * shard_count + s``; this
    sampler answers them.
    """

    def __init__(
        self,
        num_records: int,
        batch_size: int,
        *,
        shard_index: int = 0,
        shard_count: int = 1,
        mode: str = "cyclic",
        seed: int = 0,
        num_epochs: int = 1,
        position: dict | None = None,
    ) -> None:
        if num_epochs < 1:
            raise ValueError(f"num_epochs must be at least 1, got {num_epochs}")
        if not 0 <= shard_index < shard_count:
            raise ValueError(f"shard {shard_index} is not in 0..{shard_count}")
        self.batch_size, self.shard_count, self.shard_index = int(batch_size), int(shard_count), int(shard_index)
        self._plan = _z.EpochPlan(num_records, batch_size, mode, seed, drop_last=True)
        self._deal = self._plan.deal(shard_count, 1, position)
        self._streams = [self._deal.stream(s, 0) for s in range(shard_count)]
        first, later = self._streams[0].first_len, self._streams[0].epoch_len
        self.batches_per_shard = first + (num_epochs - 1) * later
        self._len = self.batches_per_shard * self.batch_size * self.shard_count
        self._cache: tuple[int, int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        from grain.python import RecordMetadata

        if not 0 <= index < self._len:
            raise IndexError(f"index {index} is outside the sampler's {self._len} records")
        shard, i = index % self.shard_count, index // self.shard_count
        step, j = divmod(i, self.batch_size)
        if self._cache is None or self._cache[:2] != (shard, step):
            self._cache = (shard, step, self._streams[shard].ids(step))
        return RecordMetadata(index=index, record_key=int(self._cache[2][j]), rng=None)

    def position_after(self, batches: int) -> dict:
        """The position once every shard read ``batches`` of its batches: pass it as
        ``position=`` to a sampler on any shard count (or to ``EpochPlan.deal``)."""
        s = self._streams[0]
        if batches < s.first_len:
            return self._deal.position_after([int(batches)] * self.shard_count)
        epoch = self._deal.epoch + 1 + (batches - s.first_len) // max(s.epoch_len, 1)
        rest = (batches - s.first_len) % max(s.epoch_len, 1)
        fresh = self._plan.deal(self.shard_count, 1, {"epoch": epoch, "done": 0, "extra": []})
        return fresh.position_after([rest] * self.shard_count)

"""Grain adapter: :class:`DataSource` is a Grain ``RandomAccessDataSource`` (``__len__``,
``__getitem__``, ``__getitems__``) over a store, view, dataset root or dict of aligned streams.

Records come back as NumPy arrays (a dict per record when there are several streams, ``str`` /
``bytes`` for utf8 / binary records). ``__getitems__`` gathers the whole batch in one call per
stream and returns per-record views of it. The source pickles as paths and options, so Grain's
worker processes reopen the stores.

>>> import grain
>>> ds = grain.MapDataset.source(zrecord.grain.DataSource("tokens.zrec")).batch(32)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _zrecord as _z
from ._sources import streams_of, text_records

__all__ = ["DataSource"]


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

"""Sources for the framework adapters (torch, Grain): what a path, Dataset, store, view or dict
of views names, as aligned ``{name: view}`` streams. No framework imports here."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _zrecord as _z

_VIEWS = (_z.DenseView, _z.RaggedView, _z.SourceView)
_STORES = (_z.DenseStore, _z.RaggedStore)


def streams_of(source: Any, streams: list[str] | None, allocator: Any, verify_checksums: bool) -> tuple[dict, bool]:
    """``({name: view}, single)``: the aligned streams a source names."""
    if isinstance(source, (str, os.PathLike)):
        # A folder or any URL the stores read (s3://, gs://, az://, http(s)://, file://):
        # decided by the store layer, not by the local file system.
        path = os.fspath(source)
        source = _z.open(path) if _z._is_store(path) else _z.Dataset(path)
    if isinstance(source, _z.Dataset):
        return dict(source.bind(allocator, verify_checksums, streams)), False
    if isinstance(source, _STORES):
        source = source.bind(allocator or _z.Allocator(), verify_checksums=verify_checksums)
    if isinstance(source, _VIEWS):
        return {"data": source}, True
    if isinstance(source, dict):
        if not source:
            raise ValueError("a dict source needs at least one stream")
        out = {}
        for name, v in source.items():
            if not isinstance(name, str):
                raise TypeError(f"stream names must be str, got {type(name).__name__}")
            if isinstance(v, _STORES):
                v = v.bind(allocator or _z.Allocator(), verify_checksums=verify_checksums)
            if not isinstance(v, _VIEWS):
                raise TypeError(f"stream '{name}' is a {type(v).__name__}; expected a store or a view")
            out[name] = v
        lens = {name: len(v) for name, v in out.items()}
        if len(set(lens.values())) != 1:
            raise ValueError(f"streams must be aligned (one record count); got {lens}")
        if streams is not None:
            missing = [s for s in streams if s not in out]
            if missing:
                raise KeyError(f"no stream named {missing[0]!r} (streams: {', '.join(out)})")
            out = {s: out[s] for s in streams}
        return out, False
    raise TypeError(
        f"a zrecord torch source is a path, a Dataset, a store, a view or a dict of views; got {type(source).__name__}"
    )


def ids_of(indices: Any, n: int) -> np.ndarray:
    ids = np.asarray(indices)
    if ids.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {ids.shape}")
    if ids.size == 0:
        return ids.astype(np.uint64)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got {ids.dtype}")
    if ids.dtype.kind == "i":
        if int(ids.min()) < -n:
            raise IndexError(f"index {int(ids.min())} is out of range for {n} records")
        ids = np.where(ids < 0, ids + n, ids)
    return np.ascontiguousarray(ids, dtype=np.uint64)


def text_records(batch: Any, logical: str) -> list:
    """The records of a ragged uint8 batch of ``utf8`` / ``binary`` records as ``str`` / ``bytes``
    (one copy of the packed values, then a slice per record)."""
    raw = np.from_dlpack(batch.values).tobytes()
    offsets = np.from_dlpack(batch.cu_seqlens).tolist()
    items = [raw[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    return [b.decode("utf-8") for b in items] if logical == "utf8" else items

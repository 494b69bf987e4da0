"""Unpickling helpers: handles pickle as what reopens them (paths, options, state), never as
mapped memory. Not public API; pickles refer to these names."""

from __future__ import annotations

import weakref

from ._zrecord import Allocator, Dataset
from ._zrecord import open as _open

# One fresh pool per original pool per process: views pickled together share a pool again.
_allocators: "weakref.WeakValueDictionary[tuple, Allocator]" = weakref.WeakValueDictionary()


def allocator(pool_id, pid, device, pool_size):
    key = (pid, pool_id, device, pool_size)
    a = _allocators.get(key)
    if a is None or a.closed:
        a = Allocator(device, pool_size)
        _allocators[key] = a
    return a


def view(path, alloc, verify_checksums):
    return _open(path).bind(alloc, verify_checksums=verify_checksums)


def dataset_stream(root, name, alloc, verify_checksums):
    return Dataset(root).view(name, alloc, verify_checksums=verify_checksums)

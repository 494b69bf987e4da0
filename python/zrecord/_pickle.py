"""Unpickling helpers: handles pickle as what reopens them (paths, options, state), never as
mapped memory. Not public API; pickles refer to these names."""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict

from ._zrecord import Allocator, Dataset, _DistReader
from ._zrecord import open as _open

# One fresh pool per original pool per process: views pickled together share a pool again.
_allocators: "weakref.WeakValueDictionary[tuple, Allocator]" = weakref.WeakValueDictionary()


def allocator(pool_id, pid, device, pool_size, max_bytes=None):
    key = (pid, pool_id, device, pool_size, max_bytes)
    a = _allocators.get(key)
    if a is None or a.closed:
        a = Allocator(device, pool_size, max_bytes)
        _allocators[key] = a
    return a


def with_storage_options(prefix, options, f, args):
    """Unpickle ``f(*args)`` after registering the storage options the pickling process had for
    ``prefix`` (an object on object storage carries them). Options this process registered
    itself for that prefix win: a worker that set its own credentials keeps them."""
    from ._zrecord import _set_storage_options, _storage_options_registered

    if options and not _storage_options_registered(prefix):
        _set_storage_options(prefix, dict(options))
    return f(*args)


def view(path, alloc, verify_checksums):
    return _open(path).bind(alloc, verify_checksums=verify_checksums)


# Streams of one root unpickled together open the root once: a few recently opened roots are
# kept, keyed by the identity of their dataset.json (a root published again is opened again).
_DATASETS_KEPT = 4
_datasets: "OrderedDict[tuple, Dataset]" = OrderedDict()


def dataset_stream(root, name, alloc, verify_checksums):
    try:
        st = os.stat(os.path.join(os.fspath(root), "dataset.json"))
        key = (os.fspath(root), st.st_dev, st.st_ino, st.st_mtime_ns)
    except OSError:
        key = None
    ds = _datasets.get(key) if key is not None else None
    if ds is None:
        ds = Dataset(root)
        if key is not None:
            _datasets[key] = ds
            while len(_datasets) > _DATASETS_KEPT:
                _datasets.popitem(last=False)
    elif key is not None:
        _datasets.move_to_end(key)
    return ds.view(name, alloc, verify_checksums=verify_checksums)


# Distributed-store views unpickled in one process share one reader per store (its own
# connections, made in this process): keyed by process and reader spec.
_DIST_KEPT = 4
_dist_readers: "OrderedDict[tuple, _DistReader]" = OrderedDict()


def dist_reader(spec):
    key = (os.getpid(), spec)
    r = _dist_readers.get(key)
    if r is None:
        r = _DistReader.from_spec(spec)
        _dist_readers[key] = r
        while len(_dist_readers) > _DIST_KEPT:
            _dist_readers.popitem(last=False)
    else:
        _dist_readers.move_to_end(key)
    return r


def dist_view(spec, name, alloc, verify_checksums):
    return dist_reader(spec).view(name, alloc, verify_checksums)

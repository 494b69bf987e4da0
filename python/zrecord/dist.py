"""Distributed store: rows of named variables sharded across processes and hosts.

Each rank registers its shard of a variable (a NumPy/DLPack array, or a zrecord store or view
served without loading it); the global row index is the concatenation of the shards in rank
order. Any rank, a forked DataLoader worker (:meth:`DistStore.fork_reader`) or an extra member
that joins later reads rows by global id::

    from zrecord.dist import DistStore
    store = DistStore(None, rendezvous="/shared/run1", rank=rank, size=size)  # or DistStore(mpi_comm)
    store.add("features", local_rows)                  # collective
    out = np.empty((len(ids), 64), np.float32)
    store.get_batch("features", out, ids)              # any order, repeats allowed

Transports are chosen per peer: ranks on the same host (same boot and network namespace) read
each other's shards in place (shared memory, or the store's own files); other hosts are asked
over Arrow Flight, all rows owned by one rank in one request, requests to every owner in flight
together. A rank that exited or does not answer within ``timeout`` seconds raises
``ConnectionError`` / ``TimeoutError`` naming the rank and variable; bad ids raise
``IndexError`` before anything is sent.

Collectives: an ``mpi4py`` communicator (``allgather`` / ``Barrier``), or :class:`FileComm`
(files in a shared folder) when ``comm`` is None. Every rank calls the collective methods
(the constructor, :meth:`~DistStore.add`, :meth:`~DistStore.init`, :meth:`~DistStore.epoch_begin`,
:meth:`~DistStore.epoch_end`) in the same order.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._zrecord import (
    DenseStore,
    DenseView,
    RaggedBatch,
    RaggedStore,
    RaggedView,
    SourceView,
    _DistNode,
    _DistReader,
    _FileComm,
    _read_state,
    CorruptStoreError,
)

__all__ = ["DistStore", "DistReader", "FileComm", "DistDataset", "HAVE_MPI"]

try:  # pragma: no cover - depends on the environment
    import mpi4py  # noqa: F401

    HAVE_MPI = True
except ImportError:  # pragma: no cover
    HAVE_MPI = False

_names = itertools.count()


class FileComm(_FileComm):
    """File-based collectives without MPI: ``allgather(obj)`` (a list in rank order) and
    ``barrier()``. ``dir`` is a folder every rank sees; every rank makes the same calls in the
    same order, with an ``ns`` unique in ``dir``. A rank that never arrives makes the others
    raise ``TimeoutError`` naming it after ``timeout`` seconds.

    ``obj`` is exchanged as JSON (``None``, bools, numbers, strings, lists, dicts with string
    keys; tuples come back as lists), never pickled: whoever can write to the folder can send
    data, not code. A message that is not JSON is ``CorruptStoreError`` naming the rank."""

    def allgather(self, obj: Any) -> list:
        try:
            data = json.dumps(obj, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise TypeError(f"FileComm.allgather exchanges JSON data only: {e}") from None
        out = []
        for rank, b in enumerate(self._allgather_bytes(data)):
            try:
                out.append(json.loads(bytes(b).decode()))
            except (UnicodeDecodeError, ValueError) as e:
                raise CorruptStoreError(f"FileComm: rank {rank}'s message in {self.dir!r} is not JSON ({e})") from None
        return out


def _allgather(comm, obj):
    return comm.allgather(obj)


def _barrier(comm):
    if hasattr(comm, "Barrier"):
        comm.Barrier()
    else:
        comm.barrier()


def _is_source(obj) -> bool:
    return isinstance(obj, (DenseStore, RaggedStore, DenseView, RaggedView, SourceView))


def _host_array(obj):
    """A NumPy view of a writable output buffer (NumPy array or CPU torch tensor)."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "numpy") and getattr(getattr(obj, "device", None), "type", "cpu") == "cpu":
        return obj.numpy()
    raise TypeError(f"out must be a NumPy array or a CPU torch tensor, got {type(obj).__name__}")


class DistReader:
    """Read side of a distributed store: ``get``, ``get_batch``, ``gather``, ``view``,
    ``info``. What :meth:`DistStore.fork_reader` returns (read-only, own connections)."""

    def __init__(self, reader: _DistReader, rank: int | None = None, size: int | None = None):
        self._reader = reader
        self._rank = rank
        self._size = size
        self._recv: dict[str, list] = {}
        self._views: dict[str, SourceView] = {}
        self._bounds: dict[str, list[int]] = {}
        # Per variable: None (ragged) or (dtype, bytes per row, item shape); what every get
        # checks `out` against, looked up once.
        self._layouts: dict[str, tuple | None] = {}

    @property
    def rank(self) -> int | None:
        return self._rank

    @property
    def size(self) -> int | None:
        return self._size

    def names(self) -> list[str]:
        """The variables."""
        return self._reader.names()

    def view(self, name: str) -> SourceView:
        """Variable ``name`` as a :class:`zrecord.SourceView` (global ids), for the Loader,
        ``SessionContext.register_sources`` and ``view[ids]``."""
        v = self._views.get(name)
        if v is None:
            v = self._views[name] = self._reader.view(name)
        return v

    def info(self, name: str) -> tuple[int, int, int]:
        """``(total_rows, disp, itemsize)``: elements per row and bytes per element (ragged
        variables: ``disp`` is the record ndim)."""
        v = self.view(name)
        total, _ = self._reader.rows(name)
        itemsize = np.dtype(v.dtype).itemsize
        if v.kind == "ragged":
            return (total, v.ndim, itemsize)
        shape = tuple(v.item_shape)
        if np.dtype(v.dtype) == np.uint8 and len(shape) == 2:
            return (total, shape[0], shape[1])
        return (total, int(np.prod(shape, dtype=np.int64)), itemsize)

    def shard_rows(self, name: str) -> list[int]:
        """Rows of each rank's shard."""
        return list(self._reader.rows(name)[1])

    def _bounds_of(self, name: str) -> list[int]:
        """First global row of each rank, then the total (cached per variable)."""
        bounds = self._bounds.get(name)
        if bounds is None:
            bounds = self._bounds[name] = [0, *itertools.accumulate(self.shard_rows(name))]
        return bounds

    def gather(self, name: str, ids):
        """Rows ``ids`` (global) as a pooled batch: a ``DLTensor`` (dense) or a
        ``RaggedBatch`` (ragged), like a local view's ``gather``."""
        return self.view(name).gather(np.asarray(ids, dtype=np.uint64) if not hasattr(ids, "__dlpack__") else ids)

    def _layout(self, name: str):
        """None for a ragged variable, else (dtype, bytes per row, item shape) (cached)."""
        try:
            return self._layouts[name]
        except KeyError:
            pass
        v = self.view(name)
        if v.kind == "ragged":
            layout = None
        else:
            dtype, shape = np.dtype(v.dtype), tuple(v.item_shape)
            layout = (dtype, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, shape)
        self._layouts[name] = layout
        return layout

    def _check_out(self, name: str, out, n: int):
        layout = self._layout(name)
        if layout is None:
            if out is not None:
                raise TypeError(f"'{name}' holds ragged records: pass out=None; the rows come back as a RaggedBatch")
            return None
        dtype, row, shape = layout
        arr = out if type(out) is np.ndarray else _host_array(out)
        if arr.ndim == 0 or arr.shape[0] != n:
            raise ValueError(f"out has {arr.shape[0] if arr.ndim else 0} rows for {n} ids (out.shape[0] must equal len(ids))")
        flags = arr.flags
        if not flags.c_contiguous or not flags.writeable:
            raise ValueError("out must be a writable C-contiguous buffer")
        if arr.dtype != dtype and dtype != np.uint8:
            raise TypeError(f"out is {arr.dtype}; '{name}' holds {dtype}")
        # Zero rows carry their width in the shape only (a 1-D empty buffer has none to check).
        got = arr.nbytes // n if n else (int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.itemsize if arr.ndim > 1 else row)
        if got != row:
            raise ValueError(f"out rows are {got} bytes; rows of '{name}' are {row} bytes ({dtype} {shape})")
        return arr

    def get_batch(self, name: str, out, ids):
        """Rows ``ids`` (global; any order, repeats allowed) into ``out`` (row i of ``out`` gets
        row ``ids[i]``). ``IndexError`` for an out-of-range id before any transfer; ``ValueError``
        when ``out.shape[0] != len(ids)`` or its rows have another size. Ragged variables:
        ``out=None``, returns the packed ``RaggedBatch``."""
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"ids must be 1-D, got shape {ids.shape}")
        if ids.size == 0:
            # Zero ids are valid on every transport, whatever dtype an empty array defaults to
            # (np.empty(0) and [] are float64): the answer is zero rows, with no transfer.
            arr = self._check_out(name, out, 0)
            if arr is None:
                return self.view(name).gather(np.empty(0, np.uint64))
            return out
        kind = ids.dtype.kind
        if kind != "u" and kind != "i":
            raise TypeError(f"ids must be integers, got {ids.dtype}")
        arr = self._check_out(name, out, len(ids))
        if kind == "i" and ids.min() < 0:
            raise IndexError(f"id {int(ids.min())} is negative")
        if arr is None:
            return self.view(name).gather(ids.astype(np.uint64, copy=False))
        return self._into(name, out, arr, ids)

    def _into(self, name: str, out, arr: np.ndarray, ids: np.ndarray):
        """Rows `ids` (checked integers) into `arr` (checked against the variable)."""
        wins = getattr(self, "_wins", None)
        if wins and name in wins:
            self._mpi_get(name, arr, ids)
            return out
        # Rows go straight into `out`; a producer that cannot lend it writable gets a copy.
        if not self._reader.get_batch_into(name, ids, arr.reshape(-1).view(np.uint8)):
            src = np.from_dlpack(self.view(name).gather(ids.astype(np.uint64, copy=False)))
            np.copyto(arr.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))
        return out

    def get(self, name: str, out, start: int = 0):
        """``len(out)`` consecutive rows from global row ``start`` into ``out``; the range must
        lie within one rank's shard (``ValueError`` naming the shards otherwise)."""
        n = (out if type(out) is np.ndarray else _host_array(out)).shape[0] if out is not None else 0
        bounds = self._bounds_of(name)
        total = bounds[-1]
        if start < 0 or start + n > total:
            raise IndexError(f"rows {start}..{start + n} out of range for '{name}' of {total} rows")
        r = bisect.bisect_right(bounds, start) - 1
        if n and start + n > bounds[r + 1]:
            raise ValueError(f"rows {start}..{start + n} of '{name}' span ranks {r} and {r + 1} (rank {r} holds {int(bounds[r])}..{int(bounds[r + 1])}); get() reads within one shard, use get_batch()")
        if n == 0 or out is None:
            return self.get_batch(name, out, np.arange(start, start + n, dtype=np.uint64))
        # In range (checked above): only `out` is left to check.
        return self._into(name, out, self._check_out(name, out, n), np.arange(start, start + n, dtype=np.uint64))

    def register_recv(self, name: str, buf) -> None:
        """Register a reused destination for ``name`` (kept referenced until
        :meth:`unregister_recv` or :meth:`free`). Reads need no registration here: this only
        keeps the buffer alive, like the original's pinned buffers."""
        self.view(name)
        self._recv.setdefault(name, []).append(buf)

    def unregister_recv(self, name: str, buf) -> None:
        bufs = self._recv.get(name, [])
        for i, b in enumerate(bufs):
            if b is buf:
                del bufs[i]
                return
        raise ValueError(f"that buffer is not registered for '{name}'")

    def get_profile(self, name: str) -> dict:
        """Counters of ``name``: calls, rows, bytes, requests (to other ranks), and seconds
        spent reading local/same-host shards (``local``), waiting for other ranks after that
        (``wait``) and in requests (``transfer``, summed over concurrent requests)."""
        return self._reader.profile(name)

    def fork_reader(self) -> "DistReader":
        """A read-only reader with its own connections: call it in a forked DataLoader worker
        (the parent's connections do not survive a fork) or give one to each thread."""
        return DistReader(_DistReader.from_spec(self._reader.spec()), None, self._size)

    def free(self) -> None:
        self._recv.clear()
        self._views.clear()
        self._bounds.clear()
        self._layouts.clear()


class DistStore(DistReader):
    """A distributed store. Call shapes (after the spec's ``PyDDStore``)::

        DistStore(comm)                                            # mpi4py communicator
        DistStore(None, rendezvous=dir, rank=r, size=n)            # no MPI: FileComm in dir
        DistStore(None, rendezvous=dir, n_core=n)                  # extra member, then join(name)
        DistStore(None, rendezvous=dir, rank=r, size=n, rejoin=True)  # a restarted rank

    ``transport``: ``"auto"`` (shared memory on the same host, Arrow Flight across hosts),
    ``"flight"`` (always Flight), ``"shm"`` (same host only) or ``"mpi"`` (with an mpi4py
    communicator: ``get`` / ``get_batch`` of array variables read through MPI RMA windows,
    ``Win.Lock`` per owner and one ``Get`` per row into ``out``; store-backed variables, views,
    ``gather`` and forked readers use ``"auto"``). ``namespace`` names this
    store's files in ``rendezvous`` (default ``s0``, ``s1``, ... in creation order).
    ``host``: the address other hosts reach this rank at (default ``ZRECORD_DIST_HOST`` or
    this host's first non-loopback IPv4 address). ``timeout``: seconds to wait for a peer.
    """

    def __init__(
        self,
        comm=None,
        transport: str = "auto",
        rendezvous: str | os.PathLike | None = None,
        rank: int | None = None,
        size: int | None = None,
        namespace: str | None = None,
        n_core: int | None = None,
        timeout: float = 30.0,
        host: str | None = None,
        rejoin: bool = False,
    ):
        ns = namespace if namespace is not None else f"s{next(_names)}"
        self._ns = ns
        self._dir = Path(rendezvous) if rendezvous is not None else None
        self._node = None
        self._comm = None
        self._rejoin = rejoin
        self._wins: dict[str, tuple] | None = None
        self._mpi_prof: dict[str, dict] = {}
        if transport == "mpi":
            if comm is None or not hasattr(comm, "Get_rank"):
                raise ValueError("transport='mpi' needs an mpi4py communicator")
            self._wins = {}
            transport = "auto"
        if comm is None and rank is None:
            if self._dir is None or n_core is None:
                raise ValueError("without a communicator, give rendezvous= and rank=/size= (a core rank) or n_core= (an extra member)")
            reader = _DistReader.join_group(str(self._dir), ns, int(n_core), timeout, transport)
            super().__init__(reader, None, int(n_core))
            return
        if comm is not None:
            crank = comm.Get_rank() if hasattr(comm, "Get_rank") else comm.rank
            csize = comm.Get_size() if hasattr(comm, "Get_size") else comm.size
            if (rank is not None and rank != crank) or (size is not None and size != csize):
                raise ValueError(f"rank={rank} / size={size} disagree with the communicator (rank {crank} of {csize})")
            rank, size = crank, csize
        else:
            if self._dir is None or size is None:
                raise ValueError("without a communicator, give rendezvous= (a shared folder), rank= and size=")
            if not rejoin:
                comm = FileComm(str(self._dir), int(rank), int(size), f"{ns}-c", timeout=max(timeout, 60.0))
        self._comm = comm
        self._node = _DistNode(
            int(rank),
            int(size),
            timeout=timeout,
            transport=transport,
            host=host,
            rendezvous=str(self._dir) if self._dir is not None else None,
            namespace=ns if self._dir is not None else None,
        )
        if rejoin:
            endpoints = [self._read_file(f"node.{r}") if r != rank else self._node.endpoint() for r in range(int(size))]
        else:
            endpoints = _allgather(comm, self._node.endpoint())
        self._node.connect(endpoints)
        super().__init__(self._node.reader(), int(rank), int(size))

    def _read_file(self, what: str) -> str:
        if self._dir is None:
            raise ValueError("rejoin needs the rendezvous folder")
        p = self._dir / f"{self._ns}.{what}"
        # Through zrecord's door to bytes: a regular file of bounded size (a FIFO planted in
        # the folder is an error, not a hang).
        raw = _read_state(str(p), 64 << 20)
        if raw is None:
            raise FileNotFoundError(f"{p} not found: did the group publish it?")
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise CorruptStoreError(f"{p}: not UTF-8 text") from None

    def _require_core(self, what: str):
        if self._node is None:
            raise RuntimeError(f"{what} is for core ranks; an extra member only reads (join)")

    def _collective_define(self, name: str, meta_or_error):
        """Exchange shard descriptions (or errors, so every rank fails together)."""
        if self._rejoin:
            if isinstance(meta_or_error, BaseException):
                raise meta_or_error
            metas = [self._read_file(f"shard.{name}.{r}") if r != self._rank else meta_or_error for r in range(self._size)]
        else:
            msg = ("error", f"{type(meta_or_error).__name__}: {meta_or_error}") if isinstance(meta_or_error, BaseException) else ("ok", meta_or_error)
            got = _allgather(self._comm, msg)
            bad = [(r, m) for r, (k, m) in enumerate(got) if k == "error"]
            if bad:
                if isinstance(meta_or_error, BaseException):
                    raise meta_or_error
                raise ValueError(f"add('{name}') failed on rank {bad[0][0]}: {bad[0][1]}")
            metas = [m for _, m in got]
        self._node.define(name, metas)
        self._views.pop(name, None)
        self._bounds.pop(name, None)
        self._layouts.pop(name, None)
        return metas

    def _mpi_window(self, name: str, metas, rows):
        """transport='mpi': an RMA window over this rank's rows of an array variable
        (collective; only when every rank's shard is an array)."""
        if self._wins is None or not all(json.loads(m)["fd"] is not None for m in metas):
            return
        from mpi4py import MPI

        buf = np.ascontiguousarray(rows).reshape(len(rows), -1).view(np.uint8).copy() if len(rows) else np.zeros((0, 1), np.uint8)
        row = max(buf.shape[1], 1)
        self._wins[name] = (MPI.Win.Create(buf, disp_unit=row, comm=self._comm), buf)
        self._mpi_prof[name] = dict.fromkeys(("calls", "rows", "bytes", "requests"), 0) | dict.fromkeys(("local", "wait", "transfer"), 0.0)

    def _mpi_get(self, name: str, arr: np.ndarray, ids: np.ndarray) -> None:
        from mpi4py import MPI

        win, buf = self._wins[name]
        bounds = self._bounds_of(name)
        ids = ids.astype(np.int64, copy=False)
        if ids.size and ids.max() >= bounds[-1]:
            raise IndexError(f"id {int(ids.max())} out of range for '{name}' of {bounds[-1]} rows")
        out = arr.reshape(len(ids), -1).view(np.uint8)
        owners = np.searchsorted(np.asarray(bounds), ids, side="right") - 1
        prof = self._mpi_prof[name]
        for t in np.unique(owners):
            ks = np.nonzero(owners == t)[0]
            local = ids[ks] - bounds[t]
            t0 = time.perf_counter()
            if t == self._rank:
                out[ks] = buf[local]
                prof["local"] += time.perf_counter() - t0
                continue
            # One lock epoch per owner: its Gets complete at Unlock.
            win.Lock(int(t), MPI.LOCK_SHARED)
            for k, i in zip(ks.tolist(), local.tolist()):
                win.Get([out[k], MPI.BYTE], int(t), target=i)
            win.Unlock(int(t))
            dt = time.perf_counter() - t0
            prof["requests"] += 1
            prof["wait"] += dt
            prof["transfer"] += dt
        prof["calls"] += 1
        prof["rows"] += len(ids)
        prof["bytes"] += out.nbytes

    def get_profile(self, name: str) -> dict:
        """As :meth:`DistReader.get_profile`; with ``transport="mpi"`` reads through RMA
        windows count too (a request is one lock epoch on another rank, its time ``wait`` and
        ``transfer``; this rank's own rows ``local``)."""
        prof = super().get_profile(name)
        for k, v in self._mpi_prof.get(name, {}).items():
            prof[k] += v
        return prof

    def add(self, name: str, arr) -> None:
        """Register this rank's shard of ``name`` (collective): a C-contiguous array or
        tensor (rows along axis 0, a 1-D array is rows of scalars; dtypes of the zrecord
        catalog), or a zrecord store / view
        served without loading it. Every rank's shard must have the same dtype and row shape."""
        self._require_core("add")
        a = None
        try:
            if _is_source(arr):
                meta = self._node.add_source(name, arr)
            else:
                a = arr if hasattr(arr, "__dlpack__") and not isinstance(arr, np.ndarray) else np.asarray(arr)
                meta = self._node.add_array(name, a)
        except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
            meta = e
        metas = self._collective_define(name, meta)
        if self._wins is not None:
            self._mpi_window(name, metas, np.from_dlpack(a) if a is not None and not isinstance(a, np.ndarray) else a)

    def init(self, name: str, nrows: int, disp: int, itemsize: int = 1, dtype=None) -> None:
        """Pre-allocate ``nrows`` zero rows of ``disp`` elements of ``itemsize`` bytes for this
        rank (collective); fill them with :meth:`update`. Without ``dtype`` the rows are raw
        bytes (``uint8``, read into any dtype of the same row size)."""
        self._require_core("init")
        try:
            if nrows < 0 or disp < 0 or itemsize <= 0:
                raise ValueError(f"nrows {nrows}, disp {disp}, itemsize {itemsize}: sizes must be >= 0 and itemsize > 0")
            if dtype is None:
                meta = self._node.init(name, int(nrows), (int(disp), int(itemsize)) if itemsize > 1 else (int(disp),), "uint8")
            else:
                dt = np.dtype(dtype)
                if dt.itemsize != itemsize and itemsize != 1:
                    raise ValueError(f"dtype {dt} has itemsize {dt.itemsize}, not {itemsize}")
                meta = self._node.init(name, int(nrows), (int(disp),), dt.name)
        except Exception as e:  # noqa: BLE001
            meta = e
        metas = self._collective_define(name, meta)
        if self._wins is not None:
            row = int(np.prod(self.view(name).item_shape, dtype=np.int64)) * np.dtype(self.view(name).dtype).itemsize
            self._mpi_window(name, metas, np.zeros((int(nrows), row), np.uint8))

    def update(self, name: str, arr, offset: int) -> None:
        """Overwrite rows ``offset..`` of this rank's shard of ``name`` (local, not collective).
        Readers on this host see the new rows at once, others on their next request."""
        self._require_core("update")
        a = np.ascontiguousarray(arr)
        if offset < 0:
            raise IndexError(f"offset {offset} is negative")
        self._node.update(name, a.reshape(-1).view(np.uint8) if a.size else a.reshape(0).view(np.uint8), int(offset))
        if self._wins is not None and name in self._wins:
            from mpi4py import MPI

            win, buf = self._wins[name]
            rows = a.reshape(-1).view(np.uint8).reshape(-1, buf.shape[1]) if a.size else buf[:0]
            win.Lock(self._rank, MPI.LOCK_EXCLUSIVE)
            buf[int(offset) : int(offset) + len(rows)] = rows
            win.Unlock(self._rank)

    def join(self, name: str) -> None:
        """Extra member: wait for the group's variable ``name`` and read it from then on."""
        if self._node is not None:
            raise RuntimeError("join() is for extra members; core ranks add() variables")
        self._reader.join(name)

    def epoch_begin(self) -> None:
        """Wait for every rank (collective); earlier updates are visible to every reader."""
        if self._comm is not None:
            _barrier(self._comm)

    def epoch_end(self) -> None:
        """Wait until every rank is done reading (collective)."""
        if self._comm is not None:
            _barrier(self._comm)

    def barrier(self) -> None:
        if self._comm is not None:
            _barrier(self._comm)

    @property
    def address(self) -> str | None:
        """This rank's Flight address (``host:port``)."""
        return self._node.address if self._node is not None else None

    def free(self) -> None:
        """Stop serving, release shards, connections and registered buffers. Idempotent."""
        super().free()
        if self._wins:
            for win, _ in self._wins.values():
                win.Free()
            self._wins.clear()
        if self._node is not None:
            self._node.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


class DistDataset:
    """A ``torch.utils.data.Dataset`` over variables of a distributed store: item ``i`` is a
    dict ``{name: row i}``; ``__getitems__`` (used by DataLoader's batch fetching) reads a
    whole batch with one :meth:`~DistReader.get_batch` per variable. In a forked worker it
    reads through its own :meth:`~DistReader.fork_reader`; pickled (spawned workers), it
    reconnects from the reader's spec in the other process."""

    def __init__(self, store: DistReader, names: Sequence[str]):
        self._store = store
        self._names = list(names)
        if not self._names:
            raise ValueError("DistDataset needs at least one variable name")
        lens = {n: store.info(n)[0] for n in self._names}
        if len(set(lens.values())) != 1:
            raise ValueError(f"variables have different row counts: {lens}")
        self._len = next(iter(lens.values()))
        self._pid = os.getpid()
        self._reader: DistReader = store

    def _r(self) -> DistReader:
        if os.getpid() != self._pid:
            self._reader = self._store.fork_reader()
            self._pid = os.getpid()
        return self._reader

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict:
        return {k: v[0] if not isinstance(v, RaggedBatch) else v for k, v in self.__getitems__([i]).items()}

    def __getitems__(self, indices) -> dict:
        r = self._r()
        ids = np.asarray(indices, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self._len):
            raise IndexError(f"index out of range for DistDataset of {self._len} rows")
        out = {}
        for n in self._names:
            v = r.view(n)
            if v.kind == "ragged":
                out[n] = r.get_batch(n, None, ids)
            else:
                buf = np.empty((len(ids), *v.item_shape), dtype=np.dtype(v.dtype))
                out[n] = r.get_batch(n, buf, ids)
        return out

    def __getstate__(self):
        # Pickled as what reconnects (spawned DataLoader workers): the reader's spec.
        return {"spec": self._store._reader.spec(), "names": self._names, "len": self._len}

    def __setstate__(self, state):
        from . import _pickle

        self._store = DistReader(_pickle.dist_reader(state["spec"]))
        self._names = list(state["names"])
        self._len = int(state["len"])
        self._pid = os.getpid()
        self._reader = self._store

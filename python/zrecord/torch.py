"""PyTorch adapters: a map-style :class:`Dataset` (one gather per batch through
``__getitems__``) and an :class:`IterableDataset` over the zrecord :class:`~zrecord.Loader`,
sharded exactly across DataLoader workers and data-parallel ranks, resumable with
``state_dict`` / ``load_state_dict`` (the protocol torchdata's ``StatefulDataLoader`` uses).

Batches arrive as torch tensors without a copy (``torch.from_dlpack`` of the pooled batch).
Ragged streams arrive as :class:`Ragged` (``values``, ``cu_seqlens``, ``shapes`` tensors);
``utf8`` / ``binary`` streams as lists of ``str`` / ``bytes``.

A source is a store or dataset-root path, a :class:`~zrecord.Dataset`, a store, a view
(``DenseView`` / ``RaggedView`` / ``SourceView``) or a dict ``{name: view}`` of aligned streams.
A single store or view yields its batches directly; several streams yield ``{name: batch}``.
Everything pickles as paths and options, so DataLoader workers (fork or spawn) reopen the
stores instead of receiving mapped memory.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

import torch
import torch.utils.data as _tud

from . import _zrecord as _z
from ._sources import ids_of, streams_of, text_records

__all__ = ["Dataset", "IterableDataset", "Ragged", "Samples", "collate", "to_torch"]

class Ragged(NamedTuple):
    """A batch of variable-shape records as torch tensors: record ``i`` is
    ``values[cu_seqlens[i]:cu_seqlens[i+1]].reshape(shapes[i])``."""

    values: torch.Tensor
    cu_seqlens: torch.Tensor
    shapes: torch.Tensor

    def __len__(self) -> int:  # type: ignore[override]
        return int(self.cu_seqlens.shape[0]) - 1

    def record(self, i: int) -> torch.Tensor:
        """Record ``i`` as a tensor of its own shape (a view of ``values``)."""
        a, b = int(self.cu_seqlens[i]), int(self.cu_seqlens[i + 1])
        return self.values[a:b].reshape([int(x) for x in self.shapes[i]])

    def to_list(self) -> list[torch.Tensor]:
        """Every record as a tensor of its own shape (views of ``values``)."""
        return [self.record(i) for i in range(len(self))]


class Samples(list):
    """What :meth:`Dataset.__getitems__` returns: one item per index, as ``ds[i]`` gives it
    (torch's contract, so the default collate, Hugging Face's Trainer and Lightning work
    unchanged), cut as views from one gather per stream. ``gathered`` is that batch (``None``
    when a per-record ``transform`` ran): :func:`collate` returns it instead of re-stacking."""

    gathered: Any = None


def collate(batch: Any) -> Any:
    """``collate_fn`` for :class:`Dataset`: the batch ``__getitems__`` gathered, as it was
    gathered (no re-stacking, zero-copy); anything else goes to torch's ``default_collate``."""
    if isinstance(batch, Samples) and batch.gathered is not None:
        return batch.gathered
    return _tud.default_collate(batch)


def _passthrough(batch: Any) -> Any:
    return batch


def _records_of(batch: Any) -> list:
    """A gathered torch batch as one item per record (views, no copies)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.unbind(0))
    if isinstance(batch, Ragged):
        return batch.to_list()
    return list(batch)


def to_torch(batch: Any, logical: str = "tensor") -> Any:
    """A zrecord batch as torch: ``DLTensor`` -> ``torch.Tensor`` (zero-copy), ``RaggedBatch``
    -> :class:`Ragged` (zero-copy) or, for ``utf8`` / ``binary`` records, a list of str / bytes."""
    if isinstance(batch, _z.RaggedBatch):
        if logical in ("utf8", "binary"):
            return text_records(batch, logical)
        return Ragged(torch.from_dlpack(batch.values), torch.from_dlpack(batch.cu_seqlens), torch.from_dlpack(batch.shapes))
    return torch.from_dlpack(batch)


def _logical(view: Any) -> str:
    return getattr(view, "logical", "tensor")


class Dataset(_tud.Dataset):
    """Map-style dataset over a store, view, dataset root or dict of aligned streams.

    ``ds[i]`` is one record (a tensor of its shape, a str for utf8 records, or a dict per stream).
    ``ds.gather(ids)`` is the whole batch from one gather per stream (a tensor, :class:`Ragged`,
    a list of str / bytes, or a dict of them), zero-copy. ``ds.__getitems__(ids)``, which
    ``torch.utils.data.DataLoader`` calls, returns the same records as a list of items
    (:class:`Samples`), so torch's default collate (and HF Trainer / Lightning) work unchanged;
    :meth:`dataloader` (or ``collate_fn=zrecord.torch.collate``) keeps the one-gather batch
    without splitting and re-stacking it. ``transform`` is applied to every item ``ds[i]`` /
    ``__getitems__`` returns and to every batch ``gather`` / :meth:`dataloader` returns.
    """

    def __init__(
        self,
        source: Any,
        *,
        streams: list[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        allocator: Any = None,
        verify_checksums: bool = True,
    ) -> None:
        self.streams, self.single = streams_of(source, streams, allocator, verify_checksums)
        self.transform = transform
        self._len = len(next(iter(self.streams.values())))

    def __len__(self) -> int:
        return self._len

    def _out(self, parts: dict) -> Any:
        out = parts["data"] if self.single else parts
        return self.transform(out) if self.transform is not None else out

    def __getitem__(self, index: int) -> Any:
        i = int(index)
        if i < -self._len or i >= self._len:
            raise IndexError(f"index {index} is out of range for {self._len} records")
        if i < 0:
            i += self._len
        parts = {}
        for name, view in self.streams.items():
            logical = _logical(view)
            b = view.gather([i])
            if isinstance(b, _z.RaggedBatch):
                parts[name] = text_records(b, logical)[0] if logical in ("utf8", "binary") else to_torch(b).record(0)
            else:
                parts[name] = torch.from_dlpack(b)[0]
        return self._out(parts)

    def _gather(self, indices: Any) -> dict:
        ids = ids_of(indices, self._len)
        return {name: to_torch(view.gather(ids), _logical(view)) for name, view in self.streams.items()}

    def gather(self, indices: Any) -> Any:
        """Records ``indices`` as one batch (one gather per stream, zero-copy), ``transform``
        applied to the batch."""
        return self._out(self._gather(indices))

    def __getitems__(self, indices: Any) -> Samples:
        parts = self._gather(indices)
        cols = {name: _records_of(b) for name, b in parts.items()}
        if self.single:
            items = cols["data"]
        else:
            n = len(next(iter(cols.values())))
            items = [{name: c[k] for name, c in cols.items()} for k in range(n)]
        if self.transform is not None:
            return Samples([self.transform(x) for x in items])
        out = Samples(items)
        out.gathered = parts["data"] if self.single else parts
        return out

    def dataloader(self, batch_size: int, *, shuffle: bool = False, sampler: Any = None, drop_last: bool = False, generator: Any = None, **kwargs: Any) -> _tud.DataLoader:
        """A ``torch.utils.data.DataLoader`` whose batches are single gathers (:meth:`gather`,
        ``transform`` applied per batch): batches of ``batch_size`` indices drawn from
        ``sampler`` (default: ``RandomSampler`` when ``shuffle``, else in order)."""
        if sampler is None:
            sampler = _tud.RandomSampler(self, generator=generator) if shuffle else _tud.SequentialSampler(self)
        batches = _tud.BatchSampler(sampler, batch_size, drop_last)
        kwargs.setdefault("collate_fn", _passthrough)
        return _tud.DataLoader(_Batches(self), batch_size=None, sampler=batches, generator=generator, **kwargs)


class _Batches(_tud.Dataset):
    """A :class:`Dataset` indexed by lists of indices: each item is one gathered batch."""

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, indices: Any) -> Any:
        return self.ds.gather(indices)


def _default_rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class IterableDataset(_tud.IterableDataset):
    """Batches from the zrecord Loader, one epoch per iteration, sharded exactly.

    An epoch is ``zrecord.EpochPlan``'s base batches of ``batch_size`` ids (positions
    ``[t*B, (t+1)*B)`` of the epoch's order: "cyclic", a fresh permutation per epoch, or
    "sequential"; "iid" draws ``ceil(n / batch_size)`` batches with replacement), dealt round
    robin to the ``S = world_size * num_workers`` shards: every DataLoader worker of every rank
    is one shard, and one step of all shards is ``S`` consecutive batches of the single-process
    stream. An epoch visits every record exactly once across all shards; the last batch may be
    short and shards may differ by one batch (``drop_last=True`` drops the short batch and the
    batches that do not fill a whole round, so every shard reads as many).

    ``set_epoch(e)`` picks the epoch (as with ``DistributedSampler``; with
    ``persistent_workers=True`` the workers keep the copy they started with, so the call does not
    reach them: use non-persistent workers to reshuffle per epoch); ``state_dict()`` /
    ``load_state_dict()`` resume inside an epoch without repeating or skipping a batch, and
    ``elastic_position(batches, num_workers)`` gives the position that ``load_state_dict({
    "position": p})`` resumes on a different world size or worker count (elastic resumption).
    ``workers`` / ``prefetch`` are the Loader's gather threads per shard. ``rank`` and
    ``world_size`` default to ``torch.distributed`` when initialised, else ``RANK`` /
    ``WORLD_SIZE`` from the environment, else 0 / 1.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        mode: str = "cyclic",
        seed: int = 0,
        drop_last: bool = False,
        streams: list[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        workers: int = 2,
        prefetch: int = 2,
        allocator: Any = None,
        verify_checksums: bool = True,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if mode not in ("cyclic", "sequential", "iid", "block"):
            raise ValueError(f"mode must be 'cyclic', 'sequential', 'iid' or 'block', got {mode!r}")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if rank is None:
            rank, world_size = _default_rank()
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size}")
        self.streams, self.single = streams_of(source, streams, allocator, verify_checksums)
        self.n = len(next(iter(self.streams.values())))
        if self.n == 0:
            raise ValueError("the source has no records")
        self.batch_size, self.mode, self.seed, self.drop_last = batch_size, mode, int(seed), bool(drop_last)
        self.rank, self.world_size = int(rank), int(world_size)
        self.transform, self.workers, self.prefetch = transform, int(workers), int(prefetch)
        self.epoch = 0
        self._batches = 0  # batches this shard yielded in the current epoch
        self._resume: dict | None = None
        self._start: dict | None = None  # the elastic position this epoch was resumed from

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order for the next iteration (call on every rank)."""
        self.epoch = int(epoch)

    def _shard(self) -> tuple[int, int]:
        """(this DataLoader worker's id, the DataLoader's worker count)."""
        info = _tud.get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def _plan(self) -> Any:
        return _z.EpochPlan(self.n, self.batch_size, self.mode, self.seed, self.drop_last)

    def batches_per_epoch(self, num_workers: int = 0) -> int:
        """Batches this rank yields per (whole) epoch through a DataLoader with ``num_workers``
        workers (all its workers together)."""
        nw = max(1, int(num_workers))
        return self._plan().deal(self.world_size, nw, {"epoch": self.epoch, "done": 0, "extra": []}).rank_len(self.rank)

    def elastic_position(self, batches: int, num_workers: int = 0) -> dict:
        """Where the job stands once every rank consumed ``batches`` batches of the current
        epoch through DataLoaders with ``num_workers`` workers: a small dict (epoch, a consumed
        prefix of base batches, the few consumed beyond it) that ``load_state_dict({"position":
        p})`` resumes on any world size and worker count, no record twice, none skipped. Every
        rank computes the same position; save it with the checkpoint."""
        nw = max(1, int(num_workers))
        deal = self._plan().deal(self.world_size, nw, self._deal_start())
        return deal.position_after([int(batches)] * self.world_size)

    def _deal_start(self) -> dict:
        """Where the current epoch's deal starts, as this (main-process) object knows it: a
        loaded state applies in DataLoader workers, which iterate copies of it."""
        r = self._resume
        if r is not None:
            return dict(r["position"]) if r["position"] is not None else {"epoch": r["epoch"], "done": 0, "extra": []}
        if self._start is not None:
            return dict(self._start)
        return {"epoch": self.epoch, "done": 0, "extra": []}

    def __len__(self) -> int:
        """Batches per epoch on this rank: inside a DataLoader worker, for that DataLoader's
        worker count; elsewhere for ``num_workers=0`` (see :meth:`batches_per_epoch`)."""
        info = _tud.get_worker_info()
        return self.batches_per_epoch(info.num_workers if info is not None else 0)

    def dataloader(self, num_workers: int = 0, **kwargs: Any) -> _tud.DataLoader:
        """A ``torch.utils.data.DataLoader`` over this dataset with ``batch_size=None`` (the
        batches are already formed; the DataLoader's default ``batch_size=1`` would wrap each
        one in another batch dimension)."""
        kwargs.setdefault("batch_size", None)
        return _tud.DataLoader(self, num_workers=num_workers, **kwargs)

    def state_dict(self) -> dict:
        """``{"epoch", "batches"}``: this shard's position (per DataLoader worker), plus the
        ``"position"`` its epoch was resumed from when that was an elastic position."""
        state = {"epoch": self.epoch, "batches": self._batches}
        if self._start is not None:
            state["position"] = dict(self._start)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume on the next iteration: from a ``state_dict()`` (the same layout), or from
        ``{"position": p}`` (``elastic_position``, any layout)."""
        if isinstance(state, dict) and set(state) == {"position"}:
            # Checked now (typed errors), dealt when iteration starts (the layout is known then).
            self._plan().deal(1, 1, state["position"])
            self._resume = {"epoch": int(state["position"]["epoch"]), "batches": 0, "position": dict(state["position"])}
            return
        try:
            epoch, batches = int(state["epoch"]), int(state["batches"])
            position = state.get("position")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a zrecord IterableDataset state: {state!r}") from e
        if epoch < 0 or batches < 0:
            raise ValueError(f"not a zrecord IterableDataset state: {state!r}")
        if position is not None:
            self._plan().deal(1, 1, position)
        self._resume = {"epoch": epoch, "batches": batches, "position": position}

    def _convert(self, parts: dict) -> Any:
        out = {name: to_torch(b, _logical(self.streams[name])) for name, b in parts.items()}
        out = out["data"] if self.single else out
        return self.transform(out) if self.transform is not None else out

    def __iter__(self):
        worker, workers = self._shard()
        start, skip = None, 0
        if self._resume is not None:
            self.epoch, skip, start = self._resume["epoch"], self._resume["batches"], self._resume["position"]
            self._resume = None
        self._start = start
        # The epoch's base batches dealt round robin to world_size x workers shards (the plan
        # is the arithmetic the Grain and JAX paths use too); this worker is one shard.
        position = start if start is not None else {"epoch": self.epoch, "done": 0, "extra": []}
        deal = self._plan().deal(self.world_size, workers, position)
        count = deal.shard_len(self.rank, worker)
        self._batches = skip
        if skip >= count:
            return
        loader = _z.Loader(
            {name: [v] for name, v in self.streams.items()},
            deal.stream(self.rank, worker),
            workers=self.workers,
            prefetch=self.prefetch,
        )
        try:
            if skip:
                loader.load_state_dict({"step": skip})
            for _ in range(count - skip):
                (parts,) = next(loader)
                out = self._convert(parts)
                self._batches += 1
                yield out
        finally:
            loader.close()

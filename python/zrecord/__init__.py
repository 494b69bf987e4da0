"""zrecord: typed, immutable, ordered ML record stores with zero-copy DLPack and Arrow gather.

Writers build a store once and publish it atomically; stores are opened read-only and bound to
an :class:`Allocator` to read. Dense reads return :class:`DLTensor` (DLPack-only, consume with
``np.from_dlpack`` / ``torch.from_dlpack``), ragged reads return :class:`RaggedBatch`. Every
batch also exports through the Arrow PyCapsule interface (``pyarrow.array(batch)``).

SQL (DataFusion): :class:`SessionContext` registers stores and dataset roots as tables and runs
queries (``COPY ... TO 'path' STORED AS ZRECORD``, ``gather('t', [ids])``, ``loader(...)``);
:class:`Table` plugs a store into the ``datafusion`` package's ``SessionContext.register_table``.
"""

from __future__ import annotations

from . import dtypes
from ._zrecord import (
    Allocator,
    ArrowBatch,
    ArrowLoader,
    CorruptStoreError,
    DenseStore,
    DenseView,
    DenseWriter,
    DLTensor,
    Loader,
    QueryResult,
    RaggedBatch,
    RaggedStore,
    RaggedView,
    RaggedWriter,
    Sampler,
    SessionContext,
    Table,
    __version__,
    train_dict,
)
from ._zrecord import open as _open

__all__ = [
    "Allocator",
    "ArrowBatch",
    "ArrowLoader",
    "CorruptStoreError",
    "DLTensor",
    "DenseStore",
    "DenseView",
    "DenseWriter",
    "Loader",
    "QueryResult",
    "RaggedBatch",
    "RaggedStore",
    "RaggedView",
    "RaggedWriter",
    "Sampler",
    "SessionContext",
    "Table",
    "dtypes",
    "open",
    "to_arrow",
    "train_dict",
    "write_dataset",
    "__version__",
]


def open(path):  # noqa: A001 - mirrors the builtin on purpose: zrecord.open(path)
    """Open the store at ``path`` and return a :class:`DenseStore` or :class:`RaggedStore`."""
    return _open(path)


def to_arrow(view, indices=None):
    """Read a view (all records, or ``indices``) as a ``pyarrow.Table`` with one column
    ``data``: ``arrow.fixed_shape_tensor`` (dense), ``list<T>`` (ragged 1-D) or
    ``arrow.variable_shape_tensor`` (ragged N-D). The table shares the gathered memory."""
    import pyarrow as pa

    batch = pa.record_batch(view.to_arrow_batch(indices))
    return pa.Table.from_batches([batch])


def _view_to_arrow(self, indices=None):
    return to_arrow(self, indices)


DenseView.to_arrow = _view_to_arrow  # type: ignore[attr-defined]
RaggedView.to_arrow = _view_to_arrow  # type: ignore[attr-defined]


def write_dataset(data, path, codec="raw", level=None, data_shards=None):
    """Write any Arrow data (a ``pyarrow.Table`` or ``RecordBatchReader``, a polars
    ``DataFrame``, a Hugging Face ``Dataset``'s ``.data.table``, anything with
    ``__arrow_c_stream__``) as a new dataset root at ``path``: one stream per column, the same
    type mapping as ``COPY ... STORED AS ZRECORD``, published atomically. Returns the record
    count."""
    ctx = SessionContext(target_partitions=1)
    ctx.register_arrow("_src", data)
    opts = [("codec", str(codec))]
    if level is not None:
        opts.append(("level", str(int(level))))
    if data_shards is not None:
        opts.append(("data_shards", str(int(data_shards))))
    options = ", ".join(f"{k} '{v}'" for k, v in opts)
    target = str(path).replace("'", "''")
    result = ctx.sql(f"COPY _src TO '{target}' STORED AS ZRECORD OPTIONS ({options})").to_arrow()
    return int(result.column(0)[0].as_py())

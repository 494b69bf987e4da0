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
    Converter,
    CorruptStoreError,
    Dataset,
    DatasetWriter,
    DenseStore,
    DenseView,
    DenseWriter,
    Deal,
    DLTensor,
    EpochPlan,
    Loader,
    Mixture,
    Packer,
    PreparedStatement,
    QueryResult,
    RaggedBatch,
    RaggedStore,
    RaggedView,
    RaggedWriter,
    Sampler,
    SessionContext,
    ShardStream,
    SourceView,
    Table,
    __version__,
    train_dict,
)
from ._zrecord import open as _open
from ._zrecord import _set_storage_options as _register_storage_options
from ._zrecord import open_files
from .convert import convert

__all__ = [
    "Allocator",
    "ArrowBatch",
    "ArrowLoader",
    "Converter",
    "CorruptStoreError",
    "Dataset",
    "DLTensor",
    "DatasetWriter",
    "Deal",
    "EpochPlan",
    "DenseStore",
    "DenseView",
    "DenseWriter",
    "Loader",
    "Mixture",
    "Packer",
    "PreparedStatement",
    "QueryResult",
    "RaggedBatch",
    "RaggedStore",
    "RaggedView",
    "RaggedWriter",
    "Sampler",
    "SessionContext",
    "ShardStream",
    "SourceView",
    "Table",
    "convert",
    "dtypes",
    "open",
    "open_files",
    "set_storage_options",
    "to_arrow",
    "train_dict",
    "write_dataset",
    "__version__",
]


def set_storage_options(url, options, pickle_secrets=True):
    """Use ``options`` for every object-store URL at or below ``url`` (``s3://bucket/prefix``,
    ``gs://``, ``az://``, ``http(s)://``): stores, dataset roots, writers, SQL and the loader
    then read and write there with them. Keys are object_store's (the same as delta-rs and
    Lance: ``aws_endpoint``, ``aws_region``, ``aws_access_key_id``, ``allow_http``,
    ``google_service_account``, ``azure_storage_account_name``, ...) plus zrecord's read plan:
    ``zrecord_coalesce_gap``, ``zrecord_max_request_bytes``, ``zrecord_max_inflight``,
    ``zrecord_max_inflight_bytes``, ``zrecord_cache_bytes``, ``zrecord_page_bytes``,
    ``zrecord_max_retries``, ``zrecord_retry_timeout_s``. Unknown keys raise ``ValueError``.
    Credentials not given here come from the environment (``AWS_*``, ``GOOGLE_*``,
    ``AZURE_*``).

    Stores, views, dataset roots and the torch / Grain datasets built on them carry these
    options when pickled (for spawned DataLoader workers, multiprocessing, Ray): the receiving
    process registers them for ``url`` unless it registered its own. To keep secrets out of
    pickles, pass ``pickle_secrets=False``: keys, secrets, tokens and passwords then stay in
    this process, and other processes take credentials from their environment (``AWS_*``
    variables, which spawned workers inherit). A request refused without any credentials
    raises ``PermissionError`` saying so."""
    _register_storage_options(str(url), {str(k): str(v) for k, v in dict(options).items()}, bool(pickle_secrets))


def open(path, storage_options=None):  # noqa: A001 - mirrors the builtin on purpose: zrecord.open(path)
    """Open the store at ``path`` (a folder, or an object-store URL: ``s3://``, ``gs://``,
    ``az://``, ``http(s)://``, ``file://``) and return a :class:`DenseStore` or
    :class:`RaggedStore`. ``storage_options``: see :func:`set_storage_options` (registered for
    ``path``)."""
    if storage_options:
        set_storage_options(path, storage_options)
    return _open(path)


def to_arrow(view, indices=None):
    """Read a view (all records, or ``indices``) as a ``pyarrow.Table`` with one column
    ``data``: ``arrow.fixed_shape_tensor`` (dense), ``list<T>`` (ragged 1-D) or
    ``arrow.variable_shape_tensor`` (ragged N-D). The table shares the gathered memory."""
    import pyarrow as pa

    batch = pa.record_batch(view.to_arrow_batch(indices))
    return pa.Table.from_batches([batch])


def write_dataset(data, path, codec="zstd", level=3, data_shards=4, allow_empty=False, progress=None):
    """Write any Arrow data (a ``pyarrow.Table`` or ``RecordBatchReader``, a polars
    ``DataFrame``, a Hugging Face ``Dataset``'s ``.data.table``, anything with
    ``__arrow_c_stream__``) as a new dataset root at ``path``: one stream per column, the same
    type mapping as ``COPY ... STORED AS ZRECORD``, streamed batch by batch (the input is never
    collected in memory) and published atomically. Returns the record count. ``progress``: None
    shows a tqdm bar when the write runs over 2 s (tqdm installed), True at once, False never.

    The defaults are :func:`zrecord.convert`'s (which also takes Hugging Face datasets and
    files, and returns a report); :class:`DatasetWriter` is the streaming object behind this
    function (append batches yourself, publish on ``close``)."""
    kwargs = {"codec": str(codec), "allow_empty": bool(allow_empty), "level": int(level), "data_shards": int(data_shards)}
    with DatasetWriter(path, **kwargs) as w:
        w.write(data, progress=progress)
    return len(w)

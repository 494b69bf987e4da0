"""Dataset conversion: Hugging Face datasets, Arrow data and files into a zrecord dataset root.

``zrecord.convert(source, root, ...)`` streams record batches into Rust (never holding the
dataset in memory) and publishes ``root`` atomically once every column is complete and the
record counts agree; an error, or Ctrl-C, publishes nothing.
"""

from __future__ import annotations

import json
import os
import time

from ._zrecord import Converter, open_files

__all__ = ["convert", "DEFAULT_BATCH_ROWS"]

#: Rows per batch taken from a Hugging Face dataset or a table.
DEFAULT_BATCH_ROWS = 8192


def _module(obj):
    return type(obj).__module__ or ""


def _is_hf(obj, name):
    return _module(obj).startswith("datasets") and any(c.__name__ == name for c in type(obj).__mro__)


def _hf_batches(ds, columns, batch_rows):
    """Record batches of a ``datasets.Dataset`` in its mapped order (``shuffle``, ``select``,
    ``filter``, ``train_test_split`` keep an indices mapping over the unchanged table): the
    mapping is read ``batch_rows`` ids at a time, contiguous runs are sliced, others taken."""
    import numpy as np
    import pyarrow as pa

    table = getattr(getattr(ds, "data", None), "table", getattr(ds, "data", None))
    indices = _private_indices(ds)
    if indices is _UNKNOWN or not isinstance(table, pa.Table):
        yield from _hf_batches_public(ds, columns, batch_rows)
        return
    if columns is not None:
        table = table.select(list(columns))
    if indices is None:
        yield from table.to_batches(max_chunksize=batch_rows)
        return
    ids = indices.column(0) if not hasattr(indices, "table") else indices.table.column(0)
    n = len(ids)
    for start in range(0, n, batch_rows):
        chunk = ids.slice(start, min(batch_rows, n - start))
        arr = chunk.to_numpy() if isinstance(chunk, pa.ChunkedArray) else np.asarray(chunk)
        if len(arr) == 0:
            continue
        lo = int(arr[0])
        if int(arr[-1]) - lo + 1 == len(arr) and np.all(np.diff(arr.astype(np.int64)) == 1):
            part = table.slice(lo, len(arr))
        else:
            part = table.take(pa.array(arr, type=pa.uint64()))
        # No combine_chunks: the converter gathers small batches itself (one copy, not two).
        yield from part.to_batches(max_chunksize=batch_rows)


_UNKNOWN = object()


def _private_indices(ds):
    """``datasets.Dataset``'s private indices mapping (a pyarrow table of row ids, or None when
    the rows are in table order), or ``_UNKNOWN`` when this ``datasets`` version keeps it some
    other way: then conversion takes the public, slower path (``_hf_batches_public``)."""
    import pyarrow as pa

    indices = getattr(ds, "_indices", _UNKNOWN)
    if indices is None or indices is _UNKNOWN:
        return indices
    table = getattr(indices, "table", indices)
    if isinstance(table, pa.Table) and table.num_columns == 1 and pa.types.is_integer(table.schema.field(0).type):
        return indices
    return _UNKNOWN


def _hf_batches_public(ds, columns, batch_rows):
    """The same batches through public ``datasets`` API only (``select_columns``,
    ``with_format("arrow")``, ``iter``): used when the private indices mapping is not what
    ``_hf_batches`` reads."""
    if columns is not None:
        ds = ds.select_columns(list(columns))
    for t in ds.with_format("arrow").iter(batch_size=batch_rows):
        yield from t.to_batches(max_chunksize=batch_rows)


#: DatasetInfo fields kept in dataset.json (the CLI keeps the same from dataset_info.json).
_HF_INFO_KEYS = ("description", "citation", "homepage", "license", "dataset_name", "config_name", "version", "builder_name")


def _hf_info(ds):
    info = {k: str(getattr(ds.info, k)) for k in _HF_INFO_KEYS if getattr(ds.info, k, None)}
    fp = getattr(ds, "_fingerprint", None)
    if fp:
        info["fingerprint"] = fp
    return info


def _source(source, columns, batch_rows):
    """(schema, batches, total_rows, features_json, metadata) of any supported source."""
    import pyarrow as pa

    if _is_hf(source, "DatasetDict") or _is_hf(source, "IterableDatasetDict"):
        splits = list(source.keys())
        raise TypeError(
            f"a DatasetDict holds several splits {splits}: convert one, e.g. zrecord.convert(ds[{splits[0]!r}], root)"
        )
    if _is_hf(source, "IterableDataset"):
        raise TypeError(
            "an IterableDataset streams rows without a table to convert; materialise it first, e.g. "
            "datasets.Dataset.from_generator(lambda: (yield from it), features=it.features), then convert that"
        )
    if _is_hf(source, "Dataset"):
        features = json.dumps(source.features.to_dict())
        meta = {"source": {"kind": "huggingface", "rows": len(source)}, "huggingface": _hf_info(source)}
        table = source.data.table if hasattr(source.data, "table") else source.data
        schema = table.schema if columns is None else table.select(list(columns)).schema
        return schema, _hf_batches(source, columns, batch_rows), len(source), features, meta
    if isinstance(source, (str, os.PathLike)):
        reader, info = open_files(os.fspath(source))
        reader = pa.RecordBatchReader.from_stream(reader)
        return reader.schema, iter(reader), info["total_rows"], info["features"], json.loads(info["metadata"])
    if isinstance(source, pa.Table):
        return source.schema, iter(source.to_batches(max_chunksize=batch_rows)), source.num_rows, None, {"source": {"kind": "arrow table"}}
    if isinstance(source, pa.RecordBatch):
        return source.schema, iter([source]), source.num_rows, None, {"source": {"kind": "arrow record batch"}}
    if isinstance(source, pa.RecordBatchReader):
        return source.schema, iter(source), None, None, {"source": {"kind": "arrow stream"}}
    if _module(source).startswith("pyarrow") and hasattr(source, "scanner"):
        # pyarrow.dataset.Dataset: scanned lazily, only the selected columns read.
        reader = source.scanner(columns=list(columns) if columns else None, batch_size=batch_rows).to_reader()
        return reader.schema, iter(reader), source.count_rows(), None, {"source": {"kind": "pyarrow dataset"}}
    if hasattr(source, "__arrow_c_stream__"):
        reader = pa.RecordBatchReader.from_stream(source)
        total = len(source) if hasattr(source, "__len__") else None
        return reader.schema, iter(reader), total, None, {"source": {"kind": _module(source).split(".")[0] or "arrow stream"}}
    raise TypeError(
        f"cannot convert {type(source).__name__}: pass a datasets.Dataset, a pyarrow Table / RecordBatchReader / dataset, "
        "anything with __arrow_c_stream__ (polars, duckdb), or a path / glob of Parquet, Arrow, CSV or JSON files"
    )


class _Progress:
    def __init__(self, progress, total):
        self.callback = None
        self.bar = None
        self.t0 = time.perf_counter()
        if callable(progress):
            self.callback = progress
        else:
            from . import _progress

            # None (the default, as everywhere): a bar once the conversion runs over 2 s; True
            # at once; ZRECORD_PROGRESS=0 turns both off.
            if _progress.enabled(None if progress else False):
                self.bar = _progress.bar(total, "convert", "rows", progress)

    def update(self, rows, nbytes):
        if self.callback is not None:
            self.callback(rows, nbytes)
        if self.bar is not None:
            self.bar.update(rows - self.bar.n)
            secs = max(time.perf_counter() - self.t0, 1e-9)
            self.bar.set_postfix_str(f"{nbytes / secs / 2**20:.1f} MiB/s", refresh=False)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def convert(
    source,
    root,
    codec="zstd",
    columns=None,
    level=3,
    data_shards=4,
    dict_bytes=None,
    train_dict=False,
    progress=None,
    decode_images=None,
    image_mode=None,
    resize=None,
    allow_empty=False,
    batch_rows=DEFAULT_BATCH_ROWS,
):
    """Convert ``source`` into a new dataset root at ``root`` (one stream per column) and
    return a report dict (``path``, ``rows``, ``bytes``, ``streams``, ``seconds``).

    ``source``: a Hugging Face ``datasets.Dataset`` (its indices mapping is honoured: after
    ``shuffle``/``select``/``filter`` the mapped rows are written, streamed, in that order), a
    ``pyarrow.Table`` / ``RecordBatchReader`` / ``pyarrow.dataset``, anything with
    ``__arrow_c_stream__`` (Polars, DuckDB), or a path / folder / glob of Parquet, Arrow IPC,
    CSV or JSON-lines files (or a ``save_to_disk`` folder).

    ``columns`` keeps those columns in that order. ``codec``: ``raw``, ``zstd`` or
    ``zstd_dict``. ``train_dict=True`` (or ``codec="zstd_dict"`` without a dictionary) trains a
    zstd dictionary per column on the first input, ``dict_bytes`` in size (default 110 KiB);
    ``dict_bytes`` given as ``bytes`` is a ready dictionary used for every column.
    ``decode_images="HWC"|"CHW"`` decodes HF ``Image`` columns (PNG/JPEG, in parallel in Rust)
    into uint8 ragged records of native sizes, or with ``resize=(h, w)`` into a dense column;
    ``image_mode`` (``"L"``, ``"LA"``, ``"RGB"``, ``"RGBA"``) converts pixel formats exactly as
    Pillow's ``Image.convert(mode)`` does (grey is ITU-R 601-2 luma in Pillow's fixed point):
    PNG input equals Pillow byte for byte in every mode; JPEG input differs from Pillow only by
    the two libraries' JPEG decoders (measured in the tests: at most a few levels per sample).
    ``progress``: ``None`` (the default) shows a tqdm bar when tqdm is installed and the
    conversion runs over 2 s, ``True`` at once, a callable is called with ``(rows, bytes)``
    after every batch, ``False`` is silent.

    :func:`zrecord.write_dataset` is the same write for Arrow-shaped data with the same
    defaults (``codec="zstd"``, ``level=3``, ``data_shards=4``, ``allow_empty=False``,
    ``progress=None``); :class:`zrecord.Converter` is the streaming object behind this function.
    """
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or not 1 <= batch_rows <= 1 << 24:
        raise ValueError(f"batch_rows must be an int in 1..=16777216, got {batch_rows!r}")
    if columns is not None:
        if isinstance(columns, str):
            columns = [columns]
        columns = list(columns)
    dictionary = None
    dict_size = None
    if isinstance(dict_bytes, (bytes, bytearray, memoryview)):
        dictionary = bytes(dict_bytes)
        if codec == "zstd":
            codec = "zstd_dict"
    elif dict_bytes is not None:
        dict_size = int(dict_bytes)
    if (train_dict or (codec == "zstd_dict" and dictionary is None)) and dictionary is None:
        dict_size = dict_size or 112_640
    else:
        dict_size = None
    schema, batches, total, features, meta = _source(source, columns, batch_rows)
    conv = Converter(
        os.fspath(root),
        schema,
        codec="zstd" if dict_size else codec,
        level=level,
        data_shards=data_shards,
        dictionary=dictionary,
        allow_empty=allow_empty,
        columns=columns,
        train_dict=dict_size,
        decode_images=decode_images,
        image_mode=image_mode,
        resize=tuple(resize) if resize is not None else None,
        features=features,
        metadata=json.dumps(meta),
    )
    bar = _Progress(progress, total)
    t0 = time.perf_counter()
    try:
        for batch in batches:
            conv.write(batch)
            bar.update(conv.rows, conv.bytes)
        report = conv.finish()
    except BaseException:
        # Errors and KeyboardInterrupt alike: the staging folder goes, nothing is published.
        conv.abort()
        raise
    finally:
        bar.close()
    report["seconds"] = time.perf_counter() - t0
    return report

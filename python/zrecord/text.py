"""Strings as tensors and text stages for pretraining pipelines.

:class:`StringTensor` holds strings in Arrow's ``Utf8View`` layout (16-byte views: length,
4-byte prefix, inline up to 12 bytes, else buffer + offset). Build it from a list of ``str``,
NumPy ``StringDType`` / object / ``U`` arrays, any pyarrow or polars string column, offsets +
bytes (validated), or a gathered ragged ``utf8`` batch; export it to pyarrow (``string_view``
zero-copy, ``string`` / ``large_string``), polars, NumPy offsets + bytes, and torch / JAX
through DLPack. Operations run in Rust, in parallel over rows, with the GIL released.

Stages map strings to strings (plus a keep mask) and fuse into one pass per row:

>>> from zrecord.text import StringTensor, TextCleaner, PIIMasker, QualityFilter, TextPipeline
>>> docs = StringTensor(["  Mail ada@example.org\\r\\n", "v1.2.3.4 is out"])
>>> text, keep = TextPipeline([TextCleaner(), PIIMasker()])(docs)
>>> text.to_list()
['Mail <EMAIL>', 'v1.2.3.4 is out']

The same stages are SQL functions: ``text_clean(col)``, ``text_quality(col, 'gopher')``,
``pii_mask(col)``, ``text_hash(col)``.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

from . import _zrecord as _z

__all__ = [
    "StringTensor",
    "TextCleaner",
    "QualityFilter",
    "PIIMasker",
    "ExactDedup",
    "NearDedup",
    "TextPipeline",
    "Tokenizer",
    "ResumablePipeline",
    "ParquetSource",
    "TextBatch",
    "make_collate",
    "quality_stats",
    "write",
]


def _np():
    import numpy as np

    return np


class StringTensor:
    """A batch of UTF-8 strings (nulls allowed) in Arrow's ``Utf8View`` layout.

    ``StringTensor(x)`` accepts a list / tuple / iterable of ``str`` or ``None``, a NumPy
    string array (``StringDType``, object or ``U``), any Arrow string array or chunked array
    (pyarrow, polars, arro3: ``Utf8``, ``LargeUtf8``, ``Utf8View``, dictionaries of them), or a
    ragged ``utf8`` :class:`~zrecord.RaggedBatch`.
    """

    __slots__ = ("_t", "copied")

    def __init__(self, data: Any = (), *, _native: Any = None):
        if _native is not None:
            self._t = _native
            self.copied = False
            return
        t, copied = _build(data)
        self._t = t
        self.copied = copied

    @classmethod
    def _wrap(cls, native: Any) -> "StringTensor":
        return cls(_native=native)

    # ---- constructors -----------------------------------------------------------------
    @classmethod
    def from_arrow(cls, obj: Any) -> "StringTensor":
        """From an Arrow string array / chunked array (no string bytes copied for ``Utf8``,
        ``LargeUtf8`` and ``Utf8View``); ``.copied`` says whether bytes were copied."""
        t, copied = _z._StringTensor.from_arrow(obj)
        out = cls._wrap(t)
        out.copied = copied
        return out

    @classmethod
    def from_offsets(cls, offsets: Any, data: Any, validity: Any = None) -> "StringTensor":
        """From ``offsets`` (int32 / int64 / uint32, n + 1 entries) into UTF-8 ``data``
        (uint8), with an optional validity mask. Offsets must be non-decreasing and within the
        data, and every string valid UTF-8 (``ValueError`` naming the first bad position)."""
        out = cls._wrap(_z._StringTensor.from_offsets(offsets, data, validity))
        out.copied = True
        return out

    @classmethod
    def from_numpy(cls, arr: Any) -> "StringTensor":
        """From a 1-D NumPy array of strings (``StringDType``, object with ``str`` / ``None``,
        or fixed-width ``U``)."""
        np = _np()
        arr = np.asarray(arr)
        if arr.ndim != 1:
            raise ValueError(f"a string array must be 1-D, got shape {arr.shape}")
        if arr.dtype.kind not in "OUT":
            raise TypeError(f"a string array must hold strings, got dtype {arr.dtype}")
        na = getattr(arr.dtype, "na_object", None)
        items = arr.tolist()
        if na is not None:
            items = [None if (x is na or (isinstance(x, float) and x != x)) else x for x in items]
        return cls._wrap(_z._StringTensor.from_list(items))

    @classmethod
    def from_batch(cls, batch: Any) -> "StringTensor":
        """From a gathered ragged ``utf8`` batch (shares its memory)."""
        return cls._wrap(_z._StringTensor.from_batch(batch))

    @classmethod
    def concat(cls, parts: Sequence["StringTensor"]) -> "StringTensor":
        return cls._wrap(_z._StringTensor.concat([p._t for p in parts]))

    # ---- basics -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._t)

    def __getitem__(self, key: Any) -> Any:
        """``t[i]`` is one string (``None`` for a null); ``t[1:3]``, ``t[::-1]``, ``t[[3, 0, -1]]``
        (positions, negative from the end) and ``t[mask]`` (a boolean array as long as ``t``)
        are StringTensors, like NumPy's basic and fancy indexing."""
        np = _np()
        if isinstance(key, slice):
            return StringTensor._wrap(self._t.take(np.arange(*key.indices(len(self)), dtype=np.int64)))
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            return self._t[int(key)]
        if isinstance(key, (bool, np.bool_)) or key is None or isinstance(key, (str, bytes, float)):
            raise TypeError(f"StringTensor indices must be integers, slices, integer arrays or boolean masks, not {type(key).__name__}")
        arr = np.asarray(key)
        if arr.dtype == bool:
            if arr.shape != (len(self),):
                raise IndexError(f"boolean mask of shape {arr.shape} for {len(self)} strings")
            return self.filter(arr)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise TypeError(f"StringTensor index arrays must be 1-d integers, got {arr.dtype} of shape {arr.shape}")
        arr = arr.astype(np.int64)
        n = len(self)
        bad = (arr < -n) | (arr >= n)
        if bad.any():
            raise IndexError(f"index {int(arr[bad][0])} out of range for {n} strings")
        return StringTensor._wrap(self._t.take(np.where(arr < 0, arr + n, arr)))

    def __iter__(self):
        return iter(self._t.to_list())

    def __repr__(self) -> str:
        return repr(self._t)

    def __eq__(self, other: Any):  # elementwise, like NumPy
        return self.eq(other)

    __hash__ = None  # type: ignore[assignment]

    @property
    def null_count(self) -> int:
        return self._t.null_count

    @property
    def nbytes(self) -> int:
        """Bytes of string data the rows address."""
        return self._t.nbytes

    def to_list(self) -> list[str | None]:
        return self._t.to_list()

    # ---- exports --------------------------------------------------------------------------
    def __arrow_c_array__(self, requested_schema: Any = None):
        return self._t.__arrow_c_array__(requested_schema)

    def to_arrow(self, type: str = "string_view"):
        """A pyarrow array: ``string_view`` (zero-copy), ``string`` or ``large_string``."""
        import pyarrow as pa

        return pa.array(self._t._export(type))

    def to_polars(self):
        """A polars ``String`` Series (polars reads the views without copying the bytes)."""
        import polars as pl

        return pl.Series(self.to_arrow("string_view"))

    def to_numpy(self, offsets: str = "int64"):
        """``(offsets, data)`` NumPy arrays of the exchange layout (one copy of the bytes);
        nulls are reported by :meth:`validity`."""
        np = _np()
        o, d = self._t.to_buffers(offsets)
        return np.from_dlpack(o), np.from_dlpack(d)

    def to_dlpack(self, offsets: str = "int64"):
        """``(offsets, data)`` DLPack producers for ``torch.from_dlpack`` / ``jax.dlpack``."""
        return self._t.to_buffers(offsets)

    def validity(self):
        """NumPy bool array, True where the row is not null."""
        return _np().from_dlpack(self._t.validity())

    # ---- operations -------------------------------------------------------------------------
    def starts_with(self, prefix: str):
        """Bool mask of rows starting with ``prefix`` (nulls False)."""
        return _np().from_dlpack(self._t.starts_with(prefix))

    def filter_by_prefix(self, prefix: str) -> "StringTensor":
        return StringTensor._wrap(self._t.filter_by_prefix(prefix))

    def eq(self, other: "str | StringTensor"):
        """Bool mask: equal to a ``str`` (broadcast) or elementwise to another tensor."""
        o = other._t if isinstance(other, StringTensor) else other
        return _np().from_dlpack(self._t.eq(o))

    def lengths(self, unit: str = "chars"):
        """uint32 lengths in ``chars`` (``len(str)``) or ``bytes``."""
        return _np().from_dlpack(self._t.lengths(unit))

    def length_between(self, min: int = 0, max: int | None = None, unit: str = "chars"):
        """Bool mask of rows with ``min <= length <= max``."""
        return _np().from_dlpack(self._t.length_between(min, 2**63 - 1 if max is None else max, unit))

    def filter_length(self, min: int = 0, max: int | None = None, unit: str = "chars") -> "StringTensor":
        """The rows with ``min <= length <= max``."""
        return StringTensor._wrap(self._t.filter_length(min, 2**63 - 1 if max is None else max, unit))

    def hash(self, seed: int = 0):
        """uint64 XXH3-64 of each row's UTF-8 bytes (``xxhash.xxh3_64_intdigest``)."""
        return _np().from_dlpack(self._t.hash(seed))

    def take(self, ids: Any) -> "StringTensor":
        """Rows at ``ids`` (order and repeats kept; ``IndexError`` when out of range)."""
        if not isinstance(ids, list):
            ids = _np().ascontiguousarray(ids)
        return StringTensor._wrap(self._t.take(ids))

    def filter(self, mask: Any) -> "StringTensor":
        """Rows where ``mask`` is true."""
        if not isinstance(mask, list):
            mask = _np().ascontiguousarray(mask, dtype=bool)
        return StringTensor._wrap(self._t.filter(mask))

    def compact(self) -> "StringTensor":
        """Copy the live strings into fresh buffers (after filters on a large tensor)."""
        return StringTensor._wrap(self._t.compact())


def _build(data: Any):
    if isinstance(data, StringTensor):
        return data._t, False
    if isinstance(data, _z._StringTensor):
        return data, False
    if isinstance(data, _z.RaggedBatch):
        return _z._StringTensor.from_batch(data), False
    if hasattr(data, "__arrow_c_array__") or hasattr(data, "__arrow_c_stream__"):
        return _z._StringTensor.from_arrow(data)
    if type(data).__module__ == "numpy":
        t = StringTensor.from_numpy(data)
        return t._t, True
    if isinstance(data, (str, bytes)):
        raise TypeError("StringTensor takes a sequence of strings, not a single string")
    return _z._StringTensor.from_list(data), True


def _as_tensor(strings: Any) -> StringTensor:
    return strings if isinstance(strings, StringTensor) else StringTensor(strings)


class _Stage:
    """A stage is callable on a StringTensor (or anything StringTensor accepts) and returns
    ``(text, keep)``; on a single ``str`` it returns the new ``str`` (or ``None`` if dropped)."""

    _spec: tuple

    def _pipeline(self):
        p = getattr(self, "_native", None)
        if p is None:
            p = _z._TextPipeline([self._spec])
            self._native = p
        return p

    def __call__(self, strings: Any):
        if isinstance(strings, str):
            text, keep = self._pipeline().run_one(strings)
            return text if keep else None
        text, keep = self._pipeline().run(_as_tensor(strings)._t)
        return StringTensor._wrap(text), _np().from_dlpack(keep)

    def kept(self, strings: Any) -> StringTensor:
        """Only the rows the stage keeps, transformed, in input order (``text.filter(keep)`` of
        ``(text, keep) = stage(strings)``, in one call)."""
        text, keep = self(_as_tensor(strings))
        return text.filter(keep)

    def arrow(self, array: Any):
        """Arrow string array -> (pyarrow ``string_view`` array, NumPy keep mask)."""
        text, keep = self(StringTensor.from_arrow(array))
        return text.to_arrow(), keep


class TextCleaner(_Stage):
    """Newline normalisation, control / invisible characters removed, optional whitespace
    collapse, NFC, trim (see the Rust ``Cleaner`` for the exact rules)."""

    def __init__(self, *, normalize_newlines: bool = True, strip_control: bool = True, collapse_whitespace: bool = False, nfc: bool = True, trim: bool = True):
        self.options = dict(normalize_newlines=normalize_newlines, strip_control=strip_control, collapse_whitespace=collapse_whitespace, nfc=nfc, trim=trim)
        self._spec = ("clean", dict(self.options))
        self._native = None


class QualityFilter(_Stage):
    """Keeps documents passing every rule of a preset (``"gopher"``, the default, or
    ``"none"``) with thresholds overridden by keyword (``min_words=20``,
    ``max_top_ngram_frac_2=None`` turns a rule off). Rule names: ``min_chars``, ``max_chars``,
    ``min_words``, ``max_words``, ``min_mean_word_len``, ``max_mean_word_len``,
    ``max_symbol_word_ratio``, ``max_digit_frac``, ``min_alpha_word_frac``, ``min_entropy``,
    ``max_dup_line_frac``, ``max_dup_line_char_frac``, ``max_bullet_line_frac``,
    ``max_ellipsis_line_frac``, ``max_top_ngram_frac_{2,3,4}``, ``max_dup_ngram_frac_{5..10}``,
    ``min_stop_words``."""

    def __init__(self, preset: str = "gopher", **rules: float | None):
        self.preset = preset
        self.rules = rules
        self._spec = ("quality", preset, dict(rules))
        self._native = None
        self._pipeline()  # validate now

    def keep(self, strings: Any):
        """Bool mask of documents kept."""
        return self(strings)[1]

    @staticmethod
    def stats(strings: Any) -> dict:
        return quality_stats(strings)


class PIIMasker(_Stage):
    """Masks validated personal data: ``email``, ``api_key``, ``iban`` (ISO 13616: country,
    length and mod-97 check; compact or grouped by spaces), ``credit_card`` (issuer prefix +
    Luhn), ``ssn``, ``ipv4`` (not version strings), ``ipv6`` (short forms such as ``::1`` only
    standing alone, so code slices like ``a[::2]`` are kept), ``phone``. ``placeholders``
    overrides ``<EMAIL>``, ``<API_KEY>``, ``<IBAN>``, ``<CREDIT_CARD>``, ``<SSN>``,
    ``<IP_ADDRESS>`` (key ``ip`` sets both address kinds), ``<PHONE>``."""

    def __init__(self, kinds: Iterable[str] | None = None, placeholders: dict[str, str] | None = None):
        self.kinds = None if kinds is None else list(kinds)
        self.placeholders = placeholders
        self._spec = ("pii", self.kinds, None if placeholders is None else dict(placeholders))
        self._native = None
        self._pipeline()

    def find(self, text: str) -> list[tuple[str, int, int]]:
        """``(kind, start, end)`` of every validated span (Python string indices)."""
        return self._pipeline().pii_find(text)


class _Committed:
    """Commit methods of the persistent dedup stages (native state in ``self._d``)."""

    _d: Any

    def commit(self) -> int:
        """Make every insert so far durable; returns the committed count."""
        return self._d.commit()

    def commit_upto(self, count: int) -> int:
        """Make durable the inserts up to when ``len(self)`` was ``count``."""
        return self._d.commit_upto(count)

    @property
    def committed(self) -> int:
        return self._d.committed


class ExactDedup(_Committed, _Stage):
    """Keeps the first occurrence of every text (XXH3-64 of its UTF-8 bytes), checked in row
    order. In memory (``path=None``; more than ``max_memory`` bytes of hashes is a
    ``MemoryError``) or persistent in the folder ``path`` (hashes past ``max_memory`` spill to
    sorted runs there; :meth:`commit` makes the inserts so far durable, and a reopened folder
    is at its last commit)."""

    def __init__(self, path: str | os.PathLike | None = None, *, max_memory: int = 1 << 30, committed: int | None = None):
        self.path = None if path is None else os.fspath(path)
        self._d = _z._ExactDedup(self.path, max_memory, committed)
        self._spec = ("dedup", self._d)
        self._native = None

    def check(self, strings: Any):
        """Bool mask: True where the text is new (it is recorded)."""
        return self(strings)[1]

    def __len__(self) -> int:
        return len(self._d)


class NearDedup(_Committed, _Stage):
    """Drops near duplicates: MinHash signatures (``num_perm`` permutations of XXH3-64
    shingle hashes, ``shingle`` chars or words) and LSH ``bands`` (chosen for ``threshold``
    when ``None``); a text is dropped when a kept text shares a band with it and their
    signatures agree in >= ``threshold`` of the positions (the Jaccard estimate). Checked in
    row order; kept signatures stay in memory (8 bytes x ``num_perm`` per kept text).

    With ``path`` the kept signatures are also logged in that folder: :meth:`commit` makes
    them durable and a reopened folder (same parameters, else ``ValueError``) is at its last
    commit, its signatures indexed again."""

    def __init__(self, threshold: float = 0.8, *, num_perm: int = 128, shingle: int = 5, unit: str = "chars", bands: int | None = None, seed: int = 1,
                 path: str | os.PathLike | None = None, committed: int | None = None):
        self.path = None if path is None else os.fspath(path)
        self._d = _z._NearDedup(threshold, num_perm, shingle, unit, bands, seed, self.path, committed)
        self.threshold, self.num_perm, self.shingle, self.unit, self.seed = threshold, num_perm, shingle, unit, seed
        self._spec = ("near_dedup", self._d)
        self._native = None

    def check(self, strings: Any):
        """Bool mask: True where the text is kept (not a near duplicate)."""
        return self(strings)[1]

    def signatures(self, strings: Any):
        """uint64 ``[n, num_perm]`` MinHash signatures (nothing is indexed)."""
        return _np().from_dlpack(self._d.signatures(_as_tensor(strings)._t))

    def permutations(self):
        """``(a, b)`` uint64 arrays: permutation i maps a shingle hash h to (a_i h + b_i) mod 2^61-1."""
        a, b = self._d.permutations()
        np = _np()
        return np.from_dlpack(a), np.from_dlpack(b)

    @property
    def bands(self) -> tuple[int, int]:
        """``(bands, rows per band)``."""
        return self._d.bands

    def __len__(self) -> int:
        return len(self._d)


class TextPipeline(_Stage):
    """Stages fused into parallel passes: a row a filter or a dedup stage drops skips the later
    stages (a PII mask after ``ExactDedup`` runs on the kept rows only; dedup stages decide in
    row order); a dropped row keeps the text it had there; a row no stage changes keeps its
    input bytes."""

    def __init__(self, stages: Sequence[_Stage]):
        self.stages = list(stages)
        for s in self.stages:
            if not isinstance(s, _Stage) or isinstance(s, TextPipeline):
                raise TypeError(f"a pipeline stage must be TextCleaner, QualityFilter, PIIMasker, ExactDedup or NearDedup, got {type(s).__name__}")
        # Each stage's compiled native stages are reused (a PII masker's patterns compile once).
        self._native = _z._TextPipeline([s._pipeline() for s in self.stages])

    def _pipeline(self):
        return self._native


class Tokenizer:
    """A Hugging Face tokenizer from a ``tokenizer.json`` (``path=`` or ``json=`` text), run by
    the ``tokenizers`` Rust crate in parallel with the GIL released."""

    def __init__(self, path: str | os.PathLike | None = None, *, json: str | None = None, add_special_tokens: bool = True):
        self._t = _z._Tokenizer(None if path is None else os.fspath(path), json, add_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._t.vocab_size

    def encode(self, strings: Any):
        """A ragged int32 :class:`~zrecord.RaggedBatch` (one record of ids per string; nulls
        are empty), ready for ``RaggedWriter.append`` or ``pyarrow.array``."""
        return self._t.encode(_as_tensor(strings)._t)

    def encode_padded(self, strings: Any, max_length: int | None = None, pad_id: int = 0):
        """``(ids, attention_mask)`` NumPy arrays ``[n, L]`` (int32, bool), L the longest
        encoding capped at ``max_length``."""
        np = _np()
        ids, mask = self._t.encode_padded(_as_tensor(strings)._t, max_length, pad_id)
        return np.from_dlpack(ids), np.from_dlpack(mask)


def quality_stats(strings: Any) -> dict:
    """Every quality statistic of every string: ``{name: NumPy array}`` (see
    :class:`QualityFilter` for the definitions)."""
    np = _np()
    d = _z._quality_stats(_as_tensor(strings)._t)
    return {k: np.from_dlpack(v) for k, v in d.items()}


# ---- exactly-once resumable pipeline ------------------------------------------------------------

class TextBatch(NamedTuple):
    """One delivered batch: the kept texts, their positions in the source, and the source
    range ``[start, end)`` the batch covers (dropped rows included)."""

    text: StringTensor
    positions: Any
    start: int
    end: int


_MAX_STATE_BYTES = 64 << 20


def _count(value, what, upper=None):
    """A stored count or index: an int in ``[0, upper]`` (bools are not counts), else
    ``CorruptStoreError`` naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (upper is not None and value > upper):
        bound = "" if upper is None else f" (at most {upper})"
        raise _z.CorruptStoreError(f"pipeline state: {what} is {value!r}, not a count >= 0{bound}; the state does not fit this source")
    return value


class _SeqSource:
    """Anything indexable by position: a list, a StringTensor, a pyarrow array / chunked array,
    a zrecord utf8 view. The position is the next row index."""

    def __init__(self, seq):
        self.seq = seq
        self.n = len(seq)
        self.pos = 0

    def seek(self, position):
        # A stored position past the end (or negative: Python slicing would wrap) is not this
        # source's: an error, never a different stream.
        self.pos = 0 if position is None else _count(position, "position", self.n)

    def read(self, n):
        start, end = self.pos, min(self.pos + n, self.n)
        if end <= start:
            return None, start, start
        s = self.seq
        if isinstance(s, StringTensor):
            text = s.take(list(range(start, end)))
        elif hasattr(s, "slice") and (hasattr(s, "__arrow_c_array__") or hasattr(s, "__arrow_c_stream__")):
            text = StringTensor(s.slice(start, end - start))
        elif hasattr(s, "to_arrow") and hasattr(s, "logical"):
            text = StringTensor(s[list(range(start, end))])
        else:
            text = StringTensor(list(s[start:end]))
        self.pos = end
        return text, start, end


class _IterSource:
    """A Python iterable with ``state_dict`` / ``load_state_dict`` (a loader, a streaming
    dataset): the position is its state after the last row read, plus the row count."""

    def __init__(self, it, field):
        self.it = it
        self.field = field
        self.rows = 0
        self._iter = None

    def seek(self, position):
        if position is not None:
            if not isinstance(position, dict) or "state" not in position:
                raise _z.CorruptStoreError(f"pipeline state: position {position!r} is not an iterable source's position (a dict with 'state' and 'rows')")
            self.rows = _count(position.get("rows"), "position.rows")
            self.it.load_state_dict(position["state"])
        self._iter = iter(self.it)

    def read(self, n):
        rows = []
        for _ in range(n):
            try:
                x = next(self._iter)
            except StopIteration:
                break
            rows.append(x if self.field is None else x[self.field])
        start = self.rows
        if not rows:
            return None, start, {"state": self.it.state_dict(), "rows": start}
        self.rows += len(rows)
        return StringTensor(rows), start, {"state": self.it.state_dict(), "rows": self.rows}


class ParquetSource:
    """One string column of Parquet files as a :class:`ResumablePipeline` source.

    ``paths``: a file, a folder (its ``*.parquet`` files), a glob, or a list of files; read in
    sorted order, one row group at a time (memory: one row group of the column). The position
    is exact (file, row in file) plus each file's size and modification time: a pipeline resumed
    after a file changed raises ``ValueError`` instead of skipping or repeating rows.
    """

    def __init__(self, paths: Any, column: str):
        import glob

        import pyarrow.parquet as pq

        if isinstance(paths, (str, os.PathLike)):
            p = os.fspath(paths)
            files = sorted(glob.glob(os.path.join(p, "*.parquet"))) if os.path.isdir(p) else sorted(glob.glob(p)) or [p]
        else:
            files = [os.fspath(f) for f in paths]
        if not files:
            raise ValueError(f"no Parquet files in {paths!r}")
        self.files = files
        self.column = column
        self._pq = pq
        self._fp = [self._fingerprint(f) for f in files]
        self._meta = []
        for f in files:
            pf = pq.ParquetFile(f)
            if column not in pf.schema_arrow.names:
                raise KeyError(f"{f}: no column {column!r} (columns: {pf.schema_arrow.names})")
            t = pf.schema_arrow.field(column).type
            import pyarrow as pa

            if not (pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t)):
                raise TypeError(f"{f}: column {column!r} is {t}, not a string column")
            self._meta.append([pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)])
        self._file, self._row, self.rows = 0, 0, 0
        self._cache = None  # (file, row group, first row, array)

    @staticmethod
    def _fingerprint(f):
        st = os.stat(f)
        return [os.path.abspath(f), st.st_size, st.st_mtime_ns]

    def seek(self, position):
        if position is None:
            self._file, self._row, self.rows = 0, 0, 0
            return
        if not isinstance(position, dict):
            raise _z.CorruptStoreError(f"pipeline state: position {position!r} is not a Parquet position")
        if position.get("files") != self._fp:
            raise ValueError("the Parquet files changed since the last commit (paths, sizes or modification times differ); resuming would skip or repeat rows")
        f = _count(position.get("file"), "position.file", len(self.files))
        row = _count(position.get("row"), "position.row", sum(self._meta[f]) if f < len(self.files) else 0)
        rows = _count(position.get("rows"), "position.rows", sum(sum(m) for m in self._meta))
        self._file, self._row, self.rows = f, row, rows

    def _group(self, f, row):
        """(array of the row group holding `row` of file `f`, its first row)."""
        first = 0
        for g, n in enumerate(self._meta[f]):
            if row < first + n:
                if self._cache is None or self._cache[:2] != (f, g):
                    t = self._pq.ParquetFile(self.files[f]).read_row_group(g, columns=[self.column])
                    self._cache = (f, g, first, t.column(0).combine_chunks())
                return self._cache[3], first
            first += n
        return None, first

    def read(self, n):
        import pyarrow as pa

        parts, got, start = [], 0, self.rows
        while got < n and self._file < len(self.files):
            arr, first = self._group(self._file, self._row)
            if arr is None:
                self._file, self._row = self._file + 1, 0
                continue
            off = self._row - first
            take = min(n - got, len(arr) - off)
            parts.append(arr.slice(off, take))
            got += take
            self._row += take
        self.rows += got
        pos = {"file": self._file, "row": self._row, "rows": self.rows, "files": self._fp}
        if not parts:
            return None, start, pos
        arr = parts[0] if len(parts) == 1 else pa.concat_arrays([p.cast(parts[0].type) for p in parts])
        return StringTensor(arr), start, pos


class ResumablePipeline:
    """Text stages over a source with a position, with background prefetch, exactly once.

    ``source``: a list / sequence of ``str``, a :class:`StringTensor`, a pyarrow (chunked)
    string array, a zrecord ``utf8`` view, a :class:`ParquetSource`, or an iterable with ``state_dict`` /
    ``load_state_dict`` (``field`` picks a key of its items). ``stages`` are run fused on every
    batch in a background thread, ``prefetch`` batches ahead. ``dedup=True`` adds an
    :class:`ExactDedup` after the stages, ``near_dedup=True`` (or a dict of
    :class:`NearDedup` parameters) a :class:`NearDedup` after that, both persisted in
    ``state_dir`` (dedup stages in ``stages`` would not be, so they are refused there).

    :meth:`commit` persists, in one atomic step, the position after the last batch delivered,
    the dedup set up to that batch (a log plus the count committed) and the consumer's
    ``user_state`` (anything JSON can hold, e.g. the length of an output file). After a crash
    at any instant, a pipeline opened on the same ``state_dir`` resumes at the last commit: the
    batches after it are produced again and none before it, and dedup decisions are replayed
    identically. So a consumer whose own output is tied to commits (``user_state``) sees every
    record exactly once.
    """

    STATE = "pipeline.json"

    def __init__(self, source: Any, stages: Sequence[_Stage] = (), *, state_dir: str | os.PathLike, batch_size: int = 1024, prefetch: int = 2,
                 dedup: bool = False, max_memory: int = 1 << 30, field: str | None = None, near_dedup: bool | dict = False):
        for s in stages:
            if isinstance(s, (ExactDedup, NearDedup)):
                raise ValueError(f"a {type(s).__name__} among the stages would not be committed with the position: use dedup=True / near_dedup=... instead")
        if not isinstance(near_dedup, (bool, dict)):
            raise TypeError(f"near_dedup must be a bool or a dict of NearDedup parameters, got {type(near_dedup).__name__}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        self.state_dir = os.fspath(state_dir)
        os.makedirs(self.state_dir, exist_ok=True)
        self.batch_size = batch_size
        self.prefetch = prefetch
        self._state_path = os.path.join(self.state_dir, self.STATE)
        st = self._load_state()
        self.user_state = st.get("user")
        self._committed_position = st.get("position")
        self._commits = _count(st.get("commits", 0), "commits")
        self._dedup = ExactDedup(os.path.join(self.state_dir, "dedup"), max_memory=max_memory, committed=_count(st.get("dedup", 0), "dedup")) if dedup else None
        self._near = None
        if near_dedup is not False:
            params = dict(near_dedup) if isinstance(near_dedup, dict) else {}
            self._near = NearDedup(**params, path=os.path.join(self.state_dir, "near_dedup"), committed=_count(st.get("near_dedup", 0), "near_dedup"))
        stage_list = list(stages) + [d for d in (self._dedup, self._near) if d is not None]
        self._pipe = TextPipeline(stage_list) if stage_list else None
        if isinstance(source, ParquetSource):
            self._src = source
        elif hasattr(source, "state_dict") and hasattr(source, "load_state_dict") and not hasattr(source, "__getitem__"):
            self._src = _IterSource(source, field)
        else:
            self._src = _SeqSource(source)
        self._src.seek(self._committed_position)
        self._delivered = None  # (position, dedup count) of the last batch handed out
        self._queue: queue.Queue = queue.Queue(maxsize=max(prefetch, 1))
        self._stop = threading.Event()
        self._thread = None
        self._error = None

    # ---- production ----
    def _produce_one(self):
        text, start, new_pos = self._src.read(self.batch_size)
        if text is None:
            return None
        if self._pipe is not None:
            out, keep = self._pipe(text)
        else:
            out, keep = text, text.validity()
        batch = TextBatch(out.filter(keep), _np().flatnonzero(keep) + start, start, start + len(text))
        counts = (len(self._dedup) if self._dedup is not None else 0, len(self._near) if self._near is not None else 0)
        return batch, new_pos, counts

    def _run(self):
        try:
            while not self._stop.is_set():
                item = self._produce_one()
                if item is None:
                    break
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # delivered to the consumer, sticky
            self._error = e
        finally:
            while not self._stop.is_set():
                try:
                    self._queue.put(None, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def __iter__(self) -> Iterator[TextBatch]:
        if self.prefetch == 0:
            while True:
                item = self._produce_one()
                if item is None:
                    return
                batch, pos, count = item
                self._delivered = (pos, count)
                yield batch
        if self._error is not None:
            raise self._error
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zrecord-text-prefetch", daemon=True)
            self._thread.start()
        while True:
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._thread.is_alive():
                    continue
                item = None
            if item is None:
                if self._error is not None:
                    raise self._error
                return
            batch, pos, count = item
            self._delivered = (pos, count)
            yield batch

    # ---- commit ----
    def commit(self, user_state: Any = None) -> None:
        """Persist the position after the last delivered batch, the dedup state up to it and
        ``user_state``, atomically (log append + fsync, then temp + fsync + rename)."""
        if self._delivered is None:
            pos = self._committed_position
            counts = tuple(d.committed if d is not None else 0 for d in (self._dedup, self._near))
        else:
            pos, counts = self._delivered
        # The dedup logs first (each cut back to its count on reopen), then the checkpoint that
        # names the counts: a crash in between leaves the old checkpoint in force.
        for d, c in zip((self._dedup, self._near), counts):
            if d is not None:
                d.commit_upto(c)
        self._commits += 1
        st = {"position": pos, "dedup": counts[0], "near_dedup": counts[1], "user": user_state, "commits": self._commits}
        _z._write_state(self._state_path, json.dumps(st).encode())
        self._committed_position = pos
        self.user_state = user_state

    def _load_state(self) -> dict:
        """The committed checkpoint (``{}`` before the first commit), read through zrecord's
        door to bytes (a regular file of at most 64 MiB: a FIFO or device there is an error,
        not a hang) and checked to be a JSON object."""
        raw = _z._read_state(self._state_path, _MAX_STATE_BYTES)
        if raw is None:
            return {}
        try:
            st = json.loads(raw.decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise _z.CorruptStoreError(f"{self._state_path}: not a pipeline checkpoint ({e})") from None
        if not isinstance(st, dict):
            raise _z.CorruptStoreError(f"{self._state_path}: a pipeline checkpoint is a JSON object, found {type(st).__name__}")
        return st

    @property
    def position(self):
        """The committed position (where a restart resumes)."""
        return self._committed_position

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_collate(stages: Sequence[_Stage] = (), *, field: str | None = "text", drop: bool = True, tokenizer: Any = None,
                 max_length: int | None = None, pad_id: int = 0):
    """A ``collate_fn`` for ``torch.utils.data.DataLoader``: takes a list of samples (``str``
    or dicts with ``field``), runs the stages fused on the batch and returns a
    :class:`StringTensor` of the kept texts (``drop=False``: ``(texts, keep)``). With a
    ``tokenizer`` it returns ``{"input_ids", "attention_mask"}`` torch tensors (padded, capped
    at ``max_length``) of the kept texts instead. ``tokenizer`` is a :class:`Tokenizer` (a
    ``tokenizer.json`` run in Rust, int32 ids, bool mask, ``pad_id`` fills) or a Hugging Face
    tokenizer callable (``transformers`` ``AutoTokenizer.from_pretrained(...)``), called as
    ``tokenizer(texts, padding=True, truncation=max_length is not None, max_length=max_length,
    return_tensors="pt")`` with its own pad token; its other outputs (``token_type_ids``...) are
    kept."""
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer) and not callable(tokenizer):
        raise TypeError(f"tokenizer must be a zrecord.text.Tokenizer or a callable Hugging Face tokenizer, got {type(tokenizer).__name__}")
    pipe = TextPipeline(list(stages)) if stages else None

    def collate(samples):
        rows = [s if isinstance(s, str) or s is None or field is None else s[field] for s in samples]
        t = StringTensor(rows)
        keep = None
        if pipe is not None:
            t, keep = pipe(t)
            if drop or tokenizer is not None:
                t = t.filter(keep)
        if tokenizer is None:
            return t if (drop or keep is None) else (t, keep)
        import torch

        if not isinstance(tokenizer, Tokenizer):
            out = tokenizer(t.to_list(), padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt")
            return dict(out)
        ids, mask = tokenizer.encode_padded(t, max_length=max_length, pad_id=pad_id)
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}

    return collate


def write(path: str | os.PathLike, strings: Any, *, codec: str = "zstd", allow_empty: bool = True, batch_rows: int = 65536, **writer_options: Any) -> int:
    """Write strings (anything :class:`StringTensor` accepts, or an iterable of such batches) to
    a ragged ``utf8`` store, one record per string, and publish it atomically; returns the
    number of records. Nulls cannot be stored (``ValueError`` naming the first one); empty
    strings are records of length 0 (``allow_empty``). ``writer_options`` go to
    :class:`~zrecord.RaggedWriter` (``level``, ``data_shards``, ...)."""
    np = _np()
    if batch_rows <= 0:
        raise ValueError(f"batch_rows must be > 0, got {batch_rows}")
    if isinstance(strings, (list, tuple, StringTensor)) or hasattr(strings, "__arrow_c_array__") or hasattr(strings, "__arrow_c_stream__") or type(strings).__module__ == "numpy":
        batches: Iterable[Any] = [strings]
    else:
        batches = strings
    n = 0
    with _z.RaggedWriter(os.fspath(path), np.uint8, 1, codec, logical="utf8", allow_empty=allow_empty, **writer_options) as w:
        for b in batches:
            t = _as_tensor(b)
            if t.null_count:
                first = int(np.flatnonzero(~t.validity())[0])
                raise ValueError(f"string {n + first} is null; a utf8 store holds strings only (use '' or filter nulls)")
            for lo in range(0, len(t), batch_rows):
                part = t.take(list(range(lo, min(lo + batch_rows, len(t))))) if len(t) > batch_rows else t
                offs, data = part.to_numpy("int32")
                shapes = np.diff(offs).astype(np.uint64).reshape(-1, 1)
                w.append(_z.RaggedBatch(data, offs, shapes))
            n += len(t)
    return n

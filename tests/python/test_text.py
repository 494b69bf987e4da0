"""zrecord.text: StringTensor constructors / exports against pyarrow, polars and NumPy; operations
against plain Python; every stage against an independent Python implementation of its rules."""

from __future__ import annotations

import collections
import math
import random
import unicodedata

import numpy as np
import pyarrow as pa
import polars as pl
import pytest

import zrecord
from zrecord.text import PIIMasker, QualityFilter, StringTensor, TextCleaner, TextPipeline, quality_stats


def corpus(n=5000, seed=0):
    rng = random.Random(seed)
    alphabet = "abcdefghij XYZ 0123 é ü 漢字 🙂 \t\n"
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.1:
            out.append(None)
        elif r < 0.15:
            out.append("")
        else:
            k = rng.choice([1, 3, 12, 13, 40, 200])
            out.append("".join(rng.choice(alphabet) for _ in range(k)))
    return out


# ---- constructors and exports ---------------------------------------------------------------

@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view()])
def test_from_arrow_every_string_type_keeps_values_and_nulls(typ):
    data = corpus()
    arr = pa.array(data, type=typ)
    t = StringTensor.from_arrow(arr)
    assert not t.copied
    assert len(t) == len(data)
    assert t.to_list() == data
    assert t.null_count == sum(x is None for x in data)
    # Never the text 'None' for a null.
    assert all(t[i] is None for i, x in enumerate(data) if x is None)
    # Chunked arrays and polars series.
    ch = pa.chunked_array([arr.slice(0, 100), arr.slice(100)])
    assert StringTensor(ch).to_list() == data
    assert StringTensor(pl.Series(data, dtype=pl.String)).to_list() == data


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
def test_from_empty_slices_and_empty_chunks_at_any_offset(typ):
    arr = pa.array(["é" * 70, "b", None, "", "tail"], type=typ)
    for k in range(len(arr) + 1):
        assert StringTensor(arr.slice(k, 0)).to_list() == []
        assert StringTensor(arr.slice(k)).to_list() == arr.to_pylist()[k:]
    # A filter that keeps nothing of one chunk leaves an empty chunk whose offsets start deep
    # inside the data; chunked arrays mixing it with full ones keep every other row.
    ch = pa.chunked_array([arr.slice(0, 2), arr.slice(2, 0), arr.slice(4, 0), arr.slice(2, 3)], type=typ)
    t = StringTensor(ch)
    assert t.to_list() == arr.to_pylist()[:2] + arr.to_pylist()[2:5]
    assert t.null_count == 1
    assert StringTensor(pa.chunked_array([arr.slice(3, 0)], type=typ)).to_list() == []
    filtered = pa.chunked_array([arr, arr]).filter(pa.chunked_array([[False] * 5, [False, False, False, False, True]]))
    assert StringTensor(filtered).to_list() == ["tail"]


def test_from_arrow_dictionary_and_bad_types():
    d = pa.array(["a", "b", "a", None]).dictionary_encode()
    t = StringTensor(d)
    assert t.copied
    assert t.to_list() == ["a", "b", "a", None]
    with pytest.raises(ValueError, match="not a string array"):
        StringTensor(pa.array([1, 2]))
    with pytest.raises(TypeError):
        StringTensor(["ok", 3])
    with pytest.raises(TypeError):
        StringTensor("a string is not a sequence of strings")


def test_from_numpy_object_unicode_and_stringdtype():
    data = ["x", "longer than twelve bytes", "", "é"]
    assert StringTensor(np.array(data, dtype=object)).to_list() == data
    assert StringTensor(np.array(data)).to_list() == data  # '<U' fixed width
    assert StringTensor(np.array(data + [None], dtype=object)).to_list() == data + [None]
    if hasattr(np.dtypes, "StringDType"):
        sd = np.array(data + [None], dtype=np.dtypes.StringDType(na_object=None))
        assert StringTensor(sd).to_list() == data + [None]
    with pytest.raises(TypeError):
        StringTensor.from_numpy(np.arange(3))


@pytest.mark.parametrize("otype", ["int32", "int64", "uint32"])
def test_offsets_round_trip_and_validation(otype):
    data = [x if x is not None else "" for x in corpus(500)]
    t = StringTensor(data)
    offs, payload = t.to_numpy(otype)
    assert offs.dtype == np.dtype(otype) and payload.dtype == np.uint8
    enc = [s.encode() for s in data]
    assert offs.tolist() == [0] + list(np.cumsum([len(b) for b in enc]))
    assert payload.tobytes() == b"".join(enc)
    back = StringTensor.from_offsets(offs, payload)
    assert back.to_list() == data
    validity = np.array([i % 2 == 0 for i in range(len(data))])
    with_nulls = StringTensor.from_offsets(offs, payload, validity)
    assert with_nulls.to_list() == [s if i % 2 == 0 else None for i, s in enumerate(data)]
    assert with_nulls.validity().tolist() == validity.tolist()


def test_from_offsets_rejects_garbage_with_positions():
    payload = np.frombuffer(b"abcdef\xffgh", dtype=np.uint8)
    with pytest.raises(ValueError, match=r"string 2 is not valid UTF-8.*position 1"):
        StringTensor.from_offsets(np.array([0, 2, 5, 9], dtype=np.int32), payload)
    with pytest.raises(ValueError, match="decrease at position 2"):
        StringTensor.from_offsets(np.array([0, 5, 3, 9], dtype=np.int64), payload)
    with pytest.raises(ValueError, match="past the 9 bytes"):
        StringTensor.from_offsets(np.array([0, 10], dtype=np.int64), payload)
    with pytest.raises(ValueError, match="negative"):
        StringTensor.from_offsets(np.array([0, -1], dtype=np.int64), payload)
    with pytest.raises(ValueError, match="splits a multi-byte"):
        StringTensor.from_offsets(np.array([0, 2, 3], dtype=np.int32), np.frombuffer("aéb".encode(), dtype=np.uint8))
    with pytest.raises(TypeError, match="offsets must be"):
        StringTensor.from_offsets(np.array([0, 1], dtype=np.float64), payload)
    with pytest.raises(ValueError, match="mask has"):
        StringTensor.from_offsets(np.array([0, 1], dtype=np.int32), payload, np.array([True, False]))


def test_exports_to_pyarrow_polars_and_dlpack():
    data = corpus(300)
    t = StringTensor(data)
    for typ, name in [(pa.string_view(), "string_view"), (pa.string(), "string"), (pa.large_string(), "large_string")]:
        a = t.to_arrow(name)
        assert a.type == typ
        assert a.to_pylist() == data
    assert pa.array(t).type == pa.string_view()
    s = t.to_polars()
    assert s.dtype == pl.String and s.to_list() == data
    o, d = t.to_dlpack("int64")
    assert np.from_dlpack(o)[-1] == sum(len((x or "").encode()) for x in data)
    assert np.from_dlpack(d).nbytes == t.nbytes
    torch = pytest.importorskip("torch")
    to, td = (torch.from_dlpack(x) for x in t.to_dlpack("int32"))
    assert to.dtype == torch.int32 and td.dtype == torch.uint8
    assert bytes(td[to[5]:to[6]].numpy()).decode() == (data[5] or "")


def test_jax_dlpack():
    jax = pytest.importorskip("jax")
    t = StringTensor(["ab", "cde"])
    o, d = t.to_dlpack("int32")
    assert jax.numpy.asarray(jax.dlpack.from_dlpack(o)).tolist() == [0, 2, 5]
    assert bytes(np.asarray(jax.dlpack.from_dlpack(d))) == b"abcde"


def test_from_a_utf8_store_batch(tmp_path):
    texts = ["", "short", "a string that is longer than twelve bytes", "ünïcödé 漢字"]
    recs = [np.frombuffer(s.encode(), dtype=np.uint8) for s in texts]
    with zrecord.RaggedWriter(tmp_path / "t", np.uint8, 1, "zstd", logical="utf8", allow_empty=True) as w:
        w.append(zrecord.RaggedBatch.from_records(recs))
    view = zrecord.open(tmp_path / "t").bind(zrecord.Allocator())
    t = StringTensor(view[[3, 0, 2]])
    assert t.to_list() == [texts[3], texts[0], texts[2]]
    # An integer batch is not text.
    ints = zrecord.RaggedBatch.from_records([np.arange(3, dtype=np.int32)])
    with pytest.raises(ValueError, match="uint8 ndim-1"):
        StringTensor(ints)


# ---- operations ------------------------------------------------------------------------------

def test_operations_match_python():
    data = corpus(20000, seed=3)
    t = StringTensor(data)
    for prefix in ["", "a", "ab", "abcd", "abcde", "é", "漢字", "zz"]:
        m = t.starts_with(prefix)
        assert m.tolist() == [x is not None and x.startswith(prefix) for x in data]
        assert t.filter_by_prefix(prefix).to_list() == [x for x in data if x is not None and x.startswith(prefix)]
        assert t.eq(prefix).tolist() == [x == prefix for x in data]
    other = StringTensor(list(reversed(data)))
    assert (t == other).tolist() == [a is not None and b is not None and a == b for a, b in zip(data, reversed(data))]
    assert t.lengths("chars").tolist() == [len(x or "") for x in data]
    assert t.lengths("bytes").tolist() == [len((x or "").encode()) for x in data]
    assert t.length_between(3, 13).tolist() == [x is not None and 3 <= len(x) <= 13 for x in data]
    assert t.filter_length(40, None, "bytes").to_list() == [x for x in data if x is not None and len(x.encode()) >= 40]
    ids = np.array([5, 0, 5, len(data) - 1], dtype=np.int64)
    assert t.take(ids).to_list() == [data[i] for i in ids]
    with pytest.raises(IndexError):
        t.take([len(data)])
    with pytest.raises(IndexError):
        t.take(np.array([-1]))
    mask = np.array([i % 3 == 0 for i in range(len(data))])
    assert t.filter(mask).to_list() == [x for i, x in enumerate(data) if i % 3 == 0]
    with pytest.raises(ValueError):
        t.filter(mask[:5])
    assert StringTensor.concat([t, t.take([1])]).to_list() == data + [data[1]]


def test_string_tensor_indexing_follows_numpy():
    data = ["a", None, "ccc", "", "ée", "f"]
    t = StringTensor(data)
    ref = np.array(data, dtype=object)
    for key in [slice(1, 3), slice(None, None, -1), slice(-2, None), slice(4, 1, -2), slice(10, 20), slice(None)]:
        got = t[key]
        assert isinstance(got, StringTensor) and got.to_list() == ref[key].tolist(), key
    for key in [[3, 0, -1, 3], np.array([5, -6], dtype=np.int32), np.array([], dtype=np.int64), []]:
        assert t[key].to_list() == ref[np.asarray(key, dtype=np.int64)].tolist(), key
    mask = np.array([True, False, True, True, False, True])
    assert t[mask].to_list() == ref[mask].tolist()
    assert t[np.int64(2)] == "ccc" and t[-1] == "f" and t[1] is None
    with pytest.raises(IndexError):
        t[[6]]
    with pytest.raises(IndexError):
        t[[-7]]
    with pytest.raises(IndexError):
        t[6]
    with pytest.raises(IndexError):
        t[mask[:3]]
    for bad in ["a", 1.5, True, None, np.array([[0]]), np.array([0.5])]:
        with pytest.raises(TypeError):
            t[bad]


def test_stage_kept_is_filter_of_keep():
    from zrecord.text import ExactDedup

    docs = ["  a  ", "b", None, " a", "c", "b"]
    text, keep = TextCleaner()(docs)
    assert TextCleaner().kept(docs).to_list() == text.filter(keep).to_list() == ["a", "b", "a", "c", "b"]
    pipe = TextPipeline([TextCleaner(), ExactDedup()])
    assert pipe.kept(docs).to_list() == ["a", "b", "c"]
    assert TextPipeline([TextCleaner(), ExactDedup()]).kept(StringTensor(docs)[::-1]).to_list() == ["b", "c", "a"]


def test_hash_is_xxh3_64():
    xxhash = pytest.importorskip("xxhash")
    data = [x or "" for x in corpus(2000)]
    t = StringTensor(data)
    assert t.hash().tolist() == [xxhash.xxh3_64_intdigest(s.encode()) for s in data]
    assert t.hash(seed=42).tolist() == [xxhash.xxh3_64_intdigest(s.encode(), seed=42) for s in data]


# ---- stages against Python references ------------------------------------------------------

def ref_clean(s, normalize_newlines=True, strip_control=True, collapse_whitespace=False, nfc=True, trim=True):
    if normalize_newlines:
        s = s.replace("\r\n", "\n")
        for c in "\r\x85\u2028\u2029":
            s = s.replace(c, "\n")
    if strip_control:
        s = "".join(c for c in s if not ((unicodedata.category(c) == "Cc" and c not in "\n\t") or c in "\u200b\u2060\ufeff"))
    if collapse_whitespace:
        out, pending, newlines = [], False, 0
        for c in s:
            if c == "\n":
                pending, newlines = False, newlines + 1
                continue
            if c.isspace():
                pending = True
                continue
            if newlines:
                out.append("\n\n" if newlines > 1 else "\n")
                newlines = 0
            elif pending and out:
                out.append(" ")
            pending = False
            out.append(c)
        if newlines and not trim:
            out.append("\n")
        s = "".join(out)
    if nfc:
        s = unicodedata.normalize("NFC", s)
    if trim:
        s = s.strip()
    return s


def messy(n=3000, seed=1):
    rng = random.Random(seed)
    pieces = ["a", "b", "Word", " ", "  ", "\t", "\n", "\r\n", "\r", "\x00", "\x07", "\u2028", "\xa0", "\ufeff", "\u200b", "e\u0301", "é", "漢", "🙂", "\x85"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(n)]


@pytest.mark.parametrize("opts", [{}, {"collapse_whitespace": True}, {"trim": False, "collapse_whitespace": True}, {"nfc": False}, {"normalize_newlines": False, "strip_control": False, "trim": False}])
def test_cleaner_matches_reference(opts):
    data = messy()
    text, keep = TextCleaner(**opts)(data)
    assert keep.all()
    got = text.to_list()
    for s, g in zip(data, got):
        assert g == ref_clean(s, **opts), repr(s)
    assert TextCleaner(**opts)(data[7]) == ref_clean(data[7], **opts)


STOP = {"the", "be", "to", "of", "and", "that", "have", "with"}


def ref_stats(text):
    chars = len(text)
    words = text.split()
    lw = [w.lower() for w in words]
    wc = sum(len(w) for w in words)
    nw = len(words)
    lines = [ln for ln in text.split("\n") if ln.strip()]
    seen, dup, dup_chars = set(), 0, 0
    for ln in lines:
        if ln in seen:
            dup += 1
            dup_chars += len(ln)
        seen.add(ln)
    r = lambda a, b: a / b if b else 0.0  # noqa: E731
    cnt = collections.Counter(text)
    st = {
        "chars": chars,
        "words": nw,
        "lines": len(lines),
        "mean_word_len": r(wc, nw),
        "symbol_word_ratio": r(text.count("#") + text.count("...") + text.count("…"), nw),
        "digit_frac": r(sum(c in "0123456789" for c in text), chars),
        "alpha_word_frac": r(sum(any(c.isalpha() for c in w) for w in words), nw),
        "entropy": -sum((c / chars) * math.log2(c / chars) for c in cnt.values()) if chars else 0.0,
        "dup_line_frac": r(dup, len(lines)),
        "dup_line_char_frac": r(dup_chars, chars),
        "bullet_line_frac": r(sum(ln.lstrip()[:1] in ("•", "‣", "◦", "-", "*") and ln.lstrip() != "" for ln in lines), len(lines)),
        "ellipsis_line_frac": r(sum(ln.rstrip().endswith(("...", "…")) for ln in lines), len(lines)),
        "stop_words": sum(w in STOP for w in lw),
    }
    for n in (2, 3, 4):
        grams = {}
        for i in range(len(lw) - n + 1):
            g = tuple(lw[i:i + n])
            c, ch = grams.get(g, (0, sum(len(w) for w in words[i:i + n])))
            grams[g] = (c + 1, ch)
        best = max((v for v in grams.values() if v[0] > 1), default=None)
        st[f"top_{n}gram_frac"] = r(best[0] * best[1], wc) if best else 0.0
    for n in range(5, 11):
        grams = collections.Counter(tuple(lw[i:i + n]) for i in range(len(lw) - n + 1))
        covered = [False] * len(lw)
        for i in range(len(lw) - n + 1):
            if grams[tuple(lw[i:i + n])] > 1:
                for j in range(i, i + n):
                    covered[j] = True
        st[f"dup_{n}gram_frac"] = r(sum(len(w) for w, c in zip(words, covered) if c), wc)
    return st


GOOD = ("The history of the printing press is a story of how ideas travel. Before movable type, books were "
        "copied by hand, which made them rare and expensive. Gutenberg's press changed that, and within fifty "
        "years printers in many cities of Europe were producing books in large numbers. This spread of knowledge "
        "had consequences that are still being studied by historians today, and it shaped the way we think about "
        "science, religion, and politics with lasting effect.")


def quality_corpus(n=400, seed=2):
    rng = random.Random(seed)
    vocab = ["the", "of", "and", "data", "model", "to", "with", "#", "...", "- item", "x1", "42", "é", "word", "repeat", "\n", "\n", "…", "*"]
    docs = [GOOD, GOOD + "\n" + GOOD, "buy now " * 60, ""]
    for _ in range(n):
        docs.append(" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 150))))
    return docs


def test_quality_stats_match_reference():
    docs = quality_corpus()
    got = quality_stats(docs)
    for i, d in enumerate(docs):
        want = ref_stats(d)
        for k, v in want.items():
            assert math.isclose(float(got[k][i]), v, rel_tol=1e-9, abs_tol=1e-12), (k, i, d[:80])


def gopher_keep(st):
    return (50 <= st["words"] <= 100_000 and 3 <= st["mean_word_len"] <= 10 and st["symbol_word_ratio"] <= 0.1
            and st["bullet_line_frac"] <= 0.9 and st["ellipsis_line_frac"] <= 0.3 and st["alpha_word_frac"] >= 0.8
            and st["stop_words"] >= 2 and st["dup_line_frac"] <= 0.3 and st["dup_line_char_frac"] <= 0.2
            and st["top_2gram_frac"] <= 0.20 and st["top_3gram_frac"] <= 0.18 and st["top_4gram_frac"] <= 0.16
            and all(st[f"dup_{n}gram_frac"] <= t for n, t in zip(range(5, 11), (0.15, 0.14, 0.13, 0.12, 0.11, 0.10))))


def test_quality_filter_gopher_matches_reference():
    docs = quality_corpus()
    keep = QualityFilter().keep(docs)
    want = [gopher_keep(ref_stats(d)) for d in docs]
    assert keep.tolist() == want
    assert want[0] and not want[2]
    # Overrides by name; None turns a rule off.
    assert QualityFilter("none", min_words=3).keep(["a b", "a b c"]).tolist() == [False, True]
    assert QualityFilter(min_words=None, min_stop_words=None, max_words=None).keep(["the cats slept on the warm mats"]).tolist() == [True]
    with pytest.raises(ValueError, match="unknown rule"):
        QualityFilter(min_wordz=3)
    with pytest.raises(ValueError, match="unknown quality preset"):
        QualityFilter("strict")


PII_CASES = [
    ("write to ada.lovelace+ml@example.co.uk today", "write to <EMAIL> today"),
    ("not an email: a@b, x@localhost", "not an email: a@b, x@localhost"),
    ("card 4111 1111 1111 1111 ok", "card <CREDIT_CARD> ok"),
    ("bad luhn 4111 1111 1111 1112", "bad luhn 4111 1111 1111 1112"),
    ("order 1234567890123456", "order 1234567890123456"),
    ("ssn 123-45-6789.", "ssn <SSN>."),
    ("ssn 000-12-3456 666-12-3456 900-12-3456", "ssn 000-12-3456 666-12-3456 900-12-3456"),
    ("host 192.168.1.20 up", "host <IP_ADDRESS> up"),
    ("v1.2.3.4 and version 1.2.3.4 and 1.2.3.4.5", "v1.2.3.4 and version 1.2.3.4 and 1.2.3.4.5"),
    ("256.1.1.1 and 01.2.3.4", "256.1.1.1 and 01.2.3.4"),
    ("ipv6 2001:db8::8a2e:370:7334 and ::1.", "ipv6 <IP_ADDRESS> and <IP_ADDRESS>."),
    ("at 12:30:45 and mac 00:1a:2b:3c:4d:5e", "at 12:30:45 and mac 00:1a:2b:3c:4d:5e"),
    ("call (415) 555-2671 or +44 20 7946 0958", "call <PHONE> or <PHONE>"),
    ("date 2024-01-15 and 123-456-7890", "date 2024-01-15 and 123-456-7890"),
    ("key sk_live_4eC39HqLyjWDarjtT1zdp7dc", "key <API_KEY>"),
    ("aws AKIAIOSFODNN7EXAMPLE", "aws <API_KEY>"),
    ("plain words only", "plain words only"),
    ("x = a[::2] + b[1::3]", "x = a[::2] + b[1::3]"),
    ("key AKIAABCDEFGHIJKLMNOP only letters", "key <API_KEY> only letters"),
    ("iban GB82 WEST 1234 5698 7654 32, bad GB82 WEST 1234 5698 7654 33", "iban <IBAN>, bad GB82 WEST 1234 5698 7654 33"),
]


def test_pii_cases_including_false_positives():
    m = PIIMasker()
    text, keep = m([c[0] for c in PII_CASES])
    assert text.to_list() == [c[1] for c in PII_CASES]
    assert keep.all()
    s = "mail a@example.org, ssn 123-45-6789 é"
    spans = m.find(s)
    assert [(k, s[a:b]) for k, a, b in spans] == [("email", "a@example.org"), ("ssn", "123-45-6789")]
    custom = PIIMasker(kinds=["email", "ipv4"], placeholders={"email": "[mail]", "ip": "[ip]"})
    assert custom("a@example.org 10.0.0.1 123-45-6789") == "[mail] [ip] 123-45-6789"
    with pytest.raises(ValueError, match="unknown kind"):
        PIIMasker(kinds=["passport"])


def test_fused_pipeline_equals_stages_in_turn():
    rng = random.Random(5)
    docs = []
    for i in range(3000):
        body = GOOD if i % 2 else "short doc"
        docs.append(f"  {body}\r\n contact u{i}@example.org or 10.1.{i % 250}.7 " + ("\x07" if i % 3 == 0 else ""))
    docs[10] = None
    rng.shuffle(docs)
    stages = [TextCleaner(collapse_whitespace=True), QualityFilter(), PIIMasker()]
    text, keep = TextPipeline(stages)(docs)
    want_text, want_keep = [], []
    for d in docs:
        if d is None:
            want_text.append(None)
            want_keep.append(False)
            continue
        c = ref_clean(d, collapse_whitespace=True)
        ok = gopher_keep(ref_stats(c))
        want_keep.append(ok)
        want_text.append(stages[2](c) if ok else c)
    assert keep.tolist() == want_keep
    assert text.to_list() == want_text
    with pytest.raises(TypeError):
        TextPipeline([TextPipeline([])])


def test_sql_functions_from_python():
    ctx = zrecord.SessionContext()
    res = ctx.sql("SELECT pii_mask(text_clean('  mail ada@example.org  ')) AS t, text_quality('x', 'none') AS q").to_arrow()
    assert res.column("t").to_pylist() == ["mail <EMAIL>"]
    assert res.column("q").to_pylist() == [True]


# ---- MinHash near-dedup against a Python implementation of the documented algorithm ---------

M61 = (1 << 61) - 1
MASK = (1 << 64) - 1


def splitmix64(seed, i):
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def ref_signature(text, num_perm, k, unit, seed, xxhash):
    a = [(splitmix64(seed, 2 * i) | 1) % M61 for i in range(num_perm)]
    b = [splitmix64(seed, 2 * i + 1) % M61 for i in range(num_perm)]
    items = list(text) if unit == "chars" else text.split()
    join = "".join if unit == "chars" else " ".join
    n = len(items)
    windows = [] if n == 0 else [join(items)] if n <= k else [join(items[i:i + k]) for i in range(n - k + 1)]
    hs = [xxhash.xxh3_64_intdigest(w.encode()) for w in windows]
    return [min(((ai * h + bi) % M61 for h in hs), default=MASK) for ai, bi in zip(a, b)]


def ref_optimal_bands(num_perm, t):
    def collide(s, b, r):
        return 1.0 - (1.0 - s ** r) ** b
    best = (1, num_perm, math.inf)
    for b in range(1, num_perm + 1):
        r = num_perm // b
        if r == 0:
            break
        fp = sum(collide(t * (k + 0.5) / 100, b, r) * t / 100 for k in range(100))
        fn = sum((1.0 - collide(t + (1.0 - t) * (k + 0.5) / 100, b, r)) * (1.0 - t) / 100 for k in range(100))
        if fp + fn < best[2]:
            best = (b, r, fp + fn)
    return best[0], best[1]


def near_corpus(seed=4):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(400)]
    base = [" ".join(rng.choice(vocab) for _ in range(60)) for _ in range(60)]
    docs, kind = [], []
    for i, d in enumerate(base):
        docs.append(d)
        kind.append("orig")
        if i % 2 == 0:
            words = d.split()
            words[rng.randrange(len(words))] = "changed"
            docs.append(" ".join(words))
            kind.append("near")
    order = list(range(len(docs)))
    return docs, kind


@pytest.mark.parametrize("unit,k", [("chars", 5), ("words", 3)])
def test_near_dedup_matches_reference(unit, k):
    xxhash = pytest.importorskip("xxhash")
    from zrecord.text import NearDedup

    docs, kind = near_corpus()
    docs = docs + ["", "abc", "ünïcödé text"]
    nd = NearDedup(0.8, num_perm=64, shingle=k, unit=unit)
    sigs = nd.signatures(docs)
    assert sigs.shape == (len(docs), 64) and sigs.dtype == np.uint64
    for i in (0, 1, 7, len(docs) - 3, len(docs) - 2, len(docs) - 1):
        assert sigs[i].tolist() == ref_signature(docs[i], 64, k, unit, 1, xxhash), i
    bands, rows = nd.bands
    assert (bands, rows) == ref_optimal_bands(64, 0.8)
    keep = nd.check(docs)
    # Reference LSH with verification.
    kept, index, want = [], [dict() for _ in range(bands)], []
    for i in range(len(docs)):
        s = ref_signature(docs[i], 64, k, unit, 1, xxhash)
        dup = False
        for band in range(bands):
            for c in index[band].get(tuple(s[band * rows:(band + 1) * rows]), []):
                if sum(x == y for x, y in zip(s, kept[c])) / 64 >= 0.8:
                    dup = True
        want.append(not dup)
        if not dup:
            for band in range(bands):
                index[band].setdefault(tuple(s[band * rows:(band + 1) * rows]), []).append(len(kept))
            kept.append(s)
    assert keep.tolist() == want
    assert len(nd) == sum(want)


def test_near_dedup_finds_the_near_copies():
    from zrecord.text import NearDedup

    docs, kind = near_corpus()
    keep = NearDedup(0.7, num_perm=128).check(docs)
    for k, kp in zip(kind, keep.tolist()):
        assert kp == (k == "orig")
    # In a pipeline after cleaning, and argument checks.
    text, keep = TextPipeline([TextCleaner(collapse_whitespace=True), NearDedup(0.7)])(["  " + docs[0], docs[1] + "\n\n", docs[0]])
    assert keep.tolist() == [True, False, False]
    with pytest.raises(ValueError, match="threshold"):
        NearDedup(1.5)
    with pytest.raises(ValueError, match="num_perm"):
        NearDedup(num_perm=0)
    with pytest.raises(ValueError, match="bands"):
        NearDedup(num_perm=8, bands=9)


def test_tokenizer_matches_huggingface(tmp_path):
    hf_tok = pytest.importorskip("tokenizers")
    from zrecord.text import Tokenizer

    corpus = [f"the record store number {i} holds données and 漢字 tokens" for i in range(200)] + ["hello world"] * 20
    hf = hf_tok.Tokenizer(hf_tok.models.BPE(unk_token="[UNK]"))
    hf.normalizer = hf_tok.normalizers.NFC()
    hf.pre_tokenizer = hf_tok.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = hf_tok.decoders.ByteLevel()
    hf.train_from_iterator(corpus, hf_tok.trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]"], initial_alphabet=hf_tok.pre_tokenizers.ByteLevel.alphabet()))
    hf.post_processor = hf_tok.processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", hf.token_to_id("[CLS]")), ("[SEP]", hf.token_to_id("[SEP]"))])
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    texts = ["hello world", "the store holds données", "", "unseen wörds ✓ 🙂", "漢字 tokens 42"]
    ours = Tokenizer(path)
    assert ours.vocab_size == hf.get_vocab_size()
    b = ours.encode(texts)
    values, cu = np.from_dlpack(b.values), np.from_dlpack(b.cu_seqlens)
    got = [values[cu[i]:cu[i + 1]].tolist() for i in range(len(texts))]
    want = [e.ids for e in hf.encode_batch(texts)]
    assert got == want
    ids, mask = ours.encode_padded(texts, max_length=6, pad_id=-1)
    assert ids.shape == (len(texts), min(6, max(map(len, want))))
    for i, w in enumerate(want):
        w = w[:ids.shape[1]]
        assert ids[i, :len(w)].tolist() == w and (ids[i, len(w):] == -1).all()
        assert mask[i].tolist() == [True] * len(w) + [False] * (ids.shape[1] - len(w))
    plain = Tokenizer(json=path.read_text(), add_special_tokens=False)
    pb = plain.encode(texts[:1])
    assert np.from_dlpack(pb.values).tolist() == hf.encode(texts[0], add_special_tokens=False).ids
    # Straight into a ragged int32 store.
    with zrecord.RaggedWriter(tmp_path / "tok", np.int32, 1, "zstd", allow_empty=True) as w:
        w.append(b)
    view = zrecord.open(tmp_path / "tok").bind(zrecord.Allocator())
    back = view[[1]]
    assert np.from_dlpack(back.values).tolist() == want[1]
    with pytest.raises(ValueError, match="tokenizer"):
        Tokenizer(json="{}")
    with pytest.raises(ValueError):
        Tokenizer()


def test_write_a_utf8_store_and_read_it_back(tmp_path):
    from zrecord.text import write

    data = ["", "short", "a longer string than twelve bytes", "ünïcödé 漢字"] * 5
    assert write(tmp_path / "s", data, batch_rows=3) == len(data)
    view = zrecord.open(tmp_path / "s").bind(zrecord.Allocator())
    assert view.to_arrow().column("s").to_pylist() == data
    assert StringTensor(view[list(range(len(data)))]).to_list() == data
    # A generator of batches (pyarrow arrays), and nulls refused with their position.
    assert write(tmp_path / "g", (pa.array(data[i:i + 4]) for i in range(0, len(data), 4))) == len(data)
    with pytest.raises(ValueError, match="string 2 is null"):
        write(tmp_path / "n", ["a", "b", None])
    assert not (tmp_path / "n").exists()
    with pytest.raises(FileExistsError):
        write(tmp_path / "s", data)

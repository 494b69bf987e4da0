"""Text stages vs luminamoon (PyPI 1.0.6) on the same inputs, in one process.

    python benches/python/text.py [--rows 100000] [--seconds 1.0] [--threads N]

Synthetic corpora (short strings ~17 bytes, long documents ~2 KB) and real text: this
interpreter's standard library sources and license files cut into ~114-byte and ~2 KB
documents at line ends ("stdlib short", "stdlib long"), with prefix filters that keep most
rows (the commonest 4-byte prefix) and long prefixes that match many rows (the commonest
8-byte one). Every row is a ratio
zrecord / luminamoon in rows per second (higher is better for zrecord); outputs are checked
equal where the two define the same result (StringTensor contents, prefix filter, lengths).
`--threads 1` pins zrecord's pool to one thread (RAYON_NUM_THREADS, set before import);
luminamoon's string ops are single-threaded Rust or Python.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=0)
    return p.parse_args()


ARGS = parse()
if ARGS.threads:
    os.environ["RAYON_NUM_THREADS"] = str(ARGS.threads)

import pyarrow as pa  # noqa: E402

from zrecord.text import ExactDedup, NearDedup, PIIMasker, QualityFilter, ResumablePipeline, StringTensor, TextCleaner, TextPipeline  # noqa: E402

try:
    import luminamoon.data as lm
    from luminamoon.data.cleaner import TextCleaner as LmCleaner
    from luminamoon.data.fused import FusedPipeline as LmFused
    from luminamoon.data.masker import PIIMasker as LmMasker
    from luminamoon.data.quality import QualityFilter as LmQuality
except ImportError:  # the peer is optional: zrecord's figures alone
    lm = None

WORDS = ["the", "data", "model", "of", "and", "training", "token", "with", "record", "store", "é", "zebra", "42", "x"]


def short_corpus(n, rng):
    return [f"{rng.choice(['pre', 'usr', 'tmp', 'key'])}_{rng.randrange(10**9):09d}{rng.choice(['', 'ab', 'xyz'])}" for _ in range(n)]


def long_corpus(n, rng):
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(330))
        extra = f" mail user{i}@example.org host 10.0.{i % 256}.{i % 200} " if i % 4 == 0 else " "
        out.append(f"  {words[:1000]}\r\n{extra}{words[1000:]}  ")
    return out


def stdlib_corpus(n, size):
    """`n` documents of about `size` bytes of real text: this interpreter's standard library
    (.py sources, then license / readme files), cut at line ends, in file order."""
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.rglob("*.py")) + sorted(p for p in root.rglob("*") if p.is_file() and p.name.upper().startswith(("LICENSE", "README", "COPYING")))
    out, cur = [], []
    width = 0
    for f in files:
        try:
            lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
        except (UnicodeDecodeError, OSError):
            continue
        for line in lines:
            cur.append(line)
            width += len(line)
            if width >= size:
                out.append("".join(cur))
                cur, width = [], 0
                if len(out) == n:
                    return out
    return out


def commonest_prefix(data, k):
    from collections import Counter

    c = Counter(s[:k] for s in data if len(s) >= k)
    return c.most_common(1)[0][0]


def web_corpus(n, rng):
    """Long documents of which a third are junk that the quality rules drop (too few words,
    symbol runs), as in crawled text."""
    docs = long_corpus(n, rng)
    for i in range(0, n, 3):
        docs[i] = f"  menu | home | login {i} " + "#" * rng.randrange(20, 200) + (" ..." * rng.randrange(1, 30))
    return docs


def fused_vs_separate(name, data):
    """The same clean -> quality -> exact dedup (-> PII) work as one TextPipeline pass, or as
    separate stage calls a user would chain (each materialises its output; the next runs on the
    kept rows). Both end with the same kept texts (checked)."""
    zt = StringTensor(data)
    n = len(data)
    clean, pii = TextCleaner(), PIIMasker()
    quality = QualityFilter("none", min_words=50, max_symbol_word_ratio=0.1, min_entropy=3.0) if not name.endswith("short") else QualityFilter("none", min_chars=14)

    def separate(with_pii):
        c, _ = clean(zt)
        q, k = quality(c)
        d, k2 = ExactDedup()(q.filter(k))
        out = d.filter(k2)
        return pii(out)[0] if with_pii else out

    def fused(with_pii):
        t, k = TextPipeline([clean, quality, ExactDedup()] + ([pii] if with_pii else []))(zt)
        return t.filter(k)

    out = []
    for with_pii in (False, True):
        a, b = separate(with_pii).to_list(), fused(with_pii).to_list()
        assert a == b, "fused and separate stages disagree"
        t_sep = timeit(lambda: separate(with_pii), ARGS.seconds)
        t_fused = timeit(lambda: fused(with_pii), ARGS.seconds)
        out.append((name, "clean+quality+dedup" + ("+pii" if with_pii else ""), n / t_fused, n / t_sep, len(a) / n))
    return out


def timeit(fn, seconds):
    fn()
    t0 = time.perf_counter()
    k = 0
    while True:
        fn()
        k += 1
        if time.perf_counter() - t0 >= seconds:
            break
    return (time.perf_counter() - t0) / k


def main():
    rng = random.Random(0)
    rows = []
    global _minhash
    _minhash = NearDedup(0.8)
    fused_rows = []
    corpora = [("short", short_corpus(ARGS.rows, rng)), ("long", long_corpus(max(ARGS.rows // 10, 1000), rng)),
               ("stdlib short", stdlib_corpus(ARGS.rows, 100)), ("stdlib long", stdlib_corpus(max(ARGS.rows // 10, 1000), 2000))]
    for name, data in corpora:
        n = len(data)
        p4, p8 = commonest_prefix(data, 4), commonest_prefix(data, 8)
        keep4 = sum(s.startswith(p4) for s in data) / n
        keep8 = sum(s.startswith(p8) for s in data) / n
        pkey = {p: f"filter_by_prefix {len(p)} chars, keeps {keep:.0%}" for p, keep in ((p4, keep4), (p8, keep8))}
        arr = pa.array(data, type=pa.string())
        zt = StringTensor(data)
        cases = {
            "build from list": (lambda: StringTensor(data), (lambda: lm.StringTensor.from_list(data)) if lm else None),
            "build from arrow": (lambda: StringTensor.from_arrow(arr), (lambda: lm.StringTensor.from_arrow(arr)) if lm else None),
            "to_arrow": (lambda: zt.to_arrow(), None),
            "filter_by_prefix": (lambda: zt.filter_by_prefix("pre"), None),
            pkey[p4]: (lambda: zt.filter_by_prefix(p4), None),
            pkey[p8]: (lambda: zt.filter_by_prefix(p8), None),
            "length filter": (lambda: zt.filter_length(10, 20, "bytes"), None),
            "hash (xxh3)": (lambda: zt.hash(), None),
            # luminamoon's cleaner trims and normalises newlines: ours with the same two rules,
            # then ours with every default rule (control characters, NFC) for reference.
            "clean (trim + newlines)": (lambda: TextCleaner(strip_control=False, nfc=False)(zt), (lambda: LmCleaner().clean_batch(data)) if lm else None),
            "clean (all rules)": (lambda: TextCleaner()(zt), None),
            "quality": (lambda: QualityFilter("none", min_words=50, max_symbol_word_ratio=0.1, min_entropy=3.0)(zt), None),
            # MinHash signatures (128 permutations, 5-char shingles); luminamoon has none.
            "minhash signatures": (lambda: _minhash.signatures(zt), None),
            "pii": (lambda: PIIMasker()(zt), (lambda: LmMasker(mask_phones=True).mask_batch(data)) if lm else None),
            "fused clean+quality": (
                lambda: TextPipeline([TextCleaner(), QualityFilter("none", min_words=50, max_symbol_word_ratio=0.1, min_entropy=3.0)])(zt),
                (lambda: LmFused(filter_quality=True, min_words=50, min_entropy=3.0, max_symbol_ratio=0.1)(data)) if lm else None,
            ),
        }
        if lm is not None:
            lt = lm.StringTensor.from_list(data)
            assert lt.to_list() == zt.to_list(), "StringTensor contents differ"
            assert lt.filter_by_prefix("pre").to_list() == zt.filter_by_prefix("pre").to_list()
            cases["to_arrow"] = (cases["to_arrow"][0], lambda: lt.to_arrow())
            cases["filter_by_prefix"] = (cases["filter_by_prefix"][0], lambda: lt.filter_by_prefix("pre"))
            for p, key in pkey.items():
                assert lt.filter_by_prefix(p).to_list() == zt.filter_by_prefix(p).to_list()
                cases[key] = (cases[key][0], lambda p=p: lt.filter_by_prefix(p))
            cases["length filter"] = (cases["length filter"][0], lambda: lt.filter_by_length(10, 20))
            cases["hash (xxh3)"] = (cases["hash (xxh3)"][0], lambda: lt.hash_all())
            q = LmQuality(min_words=50, max_symbol_ratio=0.1, min_entropy=3.0)
            cases["quality"] = (cases["quality"][0], lambda: q.filter_flags(data))
        for case, (ours, peer) in cases.items():
            t_ours = timeit(ours, ARGS.seconds)
            t_peer = timeit(peer, ARGS.seconds) if peer else None
            rows.append((name, case, n / t_ours, n / t_peer if t_peer else None))
    for name, data in [("short", short_corpus(ARGS.rows, random.Random(2))), ("long", long_corpus(max(ARGS.rows // 10, 1000), random.Random(3))),
                       ("web", web_corpus(max(ARGS.rows // 10, 1000), random.Random(4))),
                       ("stdlib short", stdlib_corpus(ARGS.rows, 100)), ("stdlib long", stdlib_corpus(max(ARGS.rows // 10, 1000), 2000))]:
        fused_rows += fused_vs_separate(name, data)
    threads = ARGS.threads or os.cpu_count()
    print(f"\n{ARGS.rows} short / {max(ARGS.rows // 10, 1000)} long rows, zrecord threads: {threads}\n")
    print("| corpus | stage | zrecord rows/s | luminamoon rows/s | ratio |")
    print("|---|---|---:|---:|---:|")
    for name, case, ours, peer in rows:
        ratio = f"{ours / peer:.1f}x" if peer else "-"
        print(f"| {name} | {case} | {ours:,.0f} | {f'{peer:,.0f}' if peer else '-'} | {ratio} |")
    print("\nfused TextPipeline vs the same stages called separately (target fused >= 1.5x)\n")
    print("| corpus | stages | rows kept | fused rows/s | separate rows/s | fused / separate |")
    print("|---|---|---:|---:|---:|---:|")
    for name, label, f, sep, kept in fused_rows:
        print(f"| {name} | {label} | {kept:.0%} | {f:,.0f} | {sep:,.0f} | {f / sep:.2f}x |")
    # Commit latency: ResumablePipeline with dedup, one commit (dedup log append + fsync, state
    # file temp + fsync + rename + dir fsync) per 1024-row batch.
    import tempfile

    with tempfile.TemporaryDirectory(dir=".") as d:
        data = short_corpus(200 * 1024, random.Random(1))
        lat = []
        with ResumablePipeline(data, [TextCleaner()], state_dir=d, batch_size=1024, prefetch=2, dedup=True) as p:
            for k, _ in enumerate(p):
                t0 = time.perf_counter()
                p.commit({"k": k})
                lat.append(time.perf_counter() - t0)
        lat.sort()
        print(f"\ncommit latency (dedup on, fsync): median {lat[len(lat) // 2] * 1e3:.2f} ms, p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms over {len(lat)} commits")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""ResumablePipeline: exactly once across SIGKILL at random instants, with prefetch and dedup;
ExactDedup persistence; the collate factory."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from zrecord.text import ExactDedup, NearDedup, ResumablePipeline, StringTensor, TextCleaner, TextPipeline, make_collate

CONSUMER = r"""
import json, os, sys
from zrecord.text import ResumablePipeline, TextCleaner
src, state, out, prefetch, dedup = sys.argv[1:6]
docs = json.load(open(src))
pipe = ResumablePipeline(docs, [TextCleaner(collapse_whitespace=True)], state_dir=state, batch_size=7,
                         prefetch=int(prefetch), dedup=dedup != "0",
                         near_dedup={"threshold": 0.6, "num_perm": 32, "shingle": 3} if dedup == "near" else False)
done = (pipe.user_state or {}).get("out", 0)
fd = os.open(out, os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, done)          # output past the last commit was never committed: drop it
os.lseek(fd, done, 0)
for batch in pipe:
    os.write(fd, "".join(f"{p}\n" for p in batch.positions.tolist()).encode())
    os.fsync(fd)
    pipe.commit({"out": os.lseek(fd, 0, 1)})
pipe.close()
print("DONE", flush=True)
"""


def make_docs(n=2500, seed=0):
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        k = rng.randrange(int(n * 0.6))
        pad = rng.choice(["", " ", "  ", "\r\n", "\t"])
        docs.append(f"{pad}document {k}  body{pad}" if i % 50 else None)
    return docs


def expected(docs, dedup):
    seen, out = set(), []
    for i, d in enumerate(docs):
        if d is None:
            continue
        c = " ".join(d.split())
        if dedup:
            if c in seen:
                continue
            seen.add(c)
        out.append(i)
    return out


@pytest.mark.parametrize("prefetch,dedup", [(0, False), (2, False), (0, True), (3, True), (2, "near")])
def test_exactly_once_across_sigkill(tmp_path, prefetch, dedup):
    docs = make_docs()
    src = tmp_path / "docs.json"
    src.write_text(json.dumps(docs))
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    state, out = tmp_path / "state", tmp_path / "out.txt"
    mode = "near" if dedup == "near" else ("1" if dedup else "0")
    args = [sys.executable, str(script), str(src), str(state), str(out), str(prefetch), mode]
    if dedup == "near":
        # Near-dedup decisions depend on everything kept before: the reference is one run
        # without interruption (the decisions themselves are checked against a Python
        # MinHash in test_text.py); it must drop near copies beyond the exact ones.
        ref_args = [sys.executable, str(script), str(src), str(tmp_path / "ref_state"), str(tmp_path / "ref.txt"), "0", mode]
        r = subprocess.run(ref_args, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
        reference = [int(x) for x in (tmp_path / "ref.txt").read_text().split()]
        assert 0 < len(reference) < len(expected(docs, True))
    else:
        reference = expected(docs, dedup)
    rng = random.Random(hash((prefetch, dedup)) & 0xFFFF)
    kills = 0
    while kills < 13:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.05, 1.2))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
        else:
            stdout, stderr = p.communicate()
            assert p.returncode == 0, stderr.decode()
            # Finished before the kill: start over from nothing to keep killing mid-run.
            state_json = state / "pipeline.json"
            if b"DONE" in stdout:
                final = [int(x) for x in out.read_text().split()]
                assert final == reference
                for f in [out]:
                    f.unlink()
                import shutil

                shutil.rmtree(state)
                assert not state_json.exists()
    r = subprocess.run(args, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    got = [int(x) for x in out.read_text().split()]
    want = reference
    lost = sorted(set(want) - set(got))
    repeated = len(got) - len(set(got))
    assert not lost and not repeated, f"lost {len(lost)} (e.g. {lost[:5]}), repeated {repeated}"
    assert got == want


def test_pipeline_batches_positions_and_resume_without_crash(tmp_path):
    docs = [f" d{i % 40} " for i in range(100)]
    p = ResumablePipeline(docs, [TextCleaner()], state_dir=tmp_path / "s", batch_size=16, prefetch=2, dedup=True)
    seen = []
    for k, b in enumerate(p):
        assert b.end - b.start == min(16, 100 - b.start)
        seen += list(zip(b.positions.tolist(), b.text.to_list()))
        if k == 1:
            p.commit({"k": k})
            break
    p.close()
    assert [t for _, t in seen] == [f"d{i}" for i in range(32)]
    p2 = ResumablePipeline(docs, [TextCleaner()], state_dir=tmp_path / "s", batch_size=16, prefetch=2, dedup=True)
    assert p2.user_state == {"k": 1} and p2.position == 32
    rest = [(pos, t) for b in p2 for pos, t in zip(b.positions.tolist(), b.text.to_list())]
    p2.close()
    # Positions 32..39 are new texts d32..d39; everything after repeats an earlier text.
    assert rest == [(i, f"d{i}") for i in range(32, 40)]


class Counter:
    """An iterable with state_dict / load_state_dict (like a stateful loader)."""

    def __init__(self, n):
        self.n, self.i = n, 0

    def __iter__(self):
        while self.i < self.n:
            self.i += 1
            yield {"text": f"row {self.i - 1}"}

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def test_pipeline_over_a_stateful_iterable(tmp_path):
    p = ResumablePipeline(Counter(50), state_dir=tmp_path / "s", batch_size=8, prefetch=1, field="text")
    it = iter(p)
    b = next(it)
    assert b.text.to_list() == [f"row {i}" for i in range(8)]
    p.commit()
    p.close()
    p2 = ResumablePipeline(Counter(50), state_dir=tmp_path / "s", batch_size=8, prefetch=1, field="text")
    texts = [t for b in p2 for t in b.text.to_list()]
    assert texts == [f"row {i}" for i in range(8, 50)]


def test_pipeline_errors_are_sticky_and_arguments_checked(tmp_path):
    with pytest.raises(ValueError):
        ResumablePipeline(["a"], state_dir=tmp_path / "x", batch_size=0)
    with pytest.raises(ValueError):
        ResumablePipeline(["a"], state_dir=tmp_path / "x", prefetch=-1)
    p = ResumablePipeline(["ok", 3, "x"], state_dir=tmp_path / "y", batch_size=1, prefetch=1)
    got = []
    with pytest.raises(TypeError):
        for b in p:
            got += b.text.to_list()
    assert got == ["ok"]
    p.close()


def test_close_with_work_queued_returns_promptly(tmp_path):
    p = ResumablePipeline([f"t{i}" for i in range(100_000)], state_dir=tmp_path / "s", batch_size=10, prefetch=4)
    it = iter(p)
    next(it)
    t0 = time.perf_counter()
    p.close()
    assert time.perf_counter() - t0 < 5


def test_exact_dedup_persists_and_cuts_uncommitted_tail(tmp_path):
    d = ExactDedup(tmp_path / "d")
    assert d.check(["a", "b", "a"]).tolist() == [True, True, False]
    assert d.commit() == 2
    assert d.check(["c", "b"]).tolist() == [True, False]
    n_before = len(d)
    del d
    # Reopened at the last commit: "c" was not committed.
    d2 = ExactDedup(tmp_path / "d")
    assert d2.committed == 2 and len(d2) == 2 and n_before == 3
    assert d2.check(["c", "a"]).tolist() == [True, False]
    # Opened at an explicit (older) count: the log is cut back.
    d3 = ExactDedup(tmp_path / "d", committed=1)
    assert d3.check(["b"]).tolist() == [True]
    with pytest.raises(OSError):
        ExactDedup(tmp_path / "d", committed=99)


def test_exact_dedup_memory_bound_and_spill(tmp_path):
    mem = ExactDedup(max_memory=1000)
    with pytest.raises(MemoryError):
        mem.check([f"s{i}" for i in range(1000)])
    # Persistent: spills sorted runs to disk, answers stay exact.
    d = ExactDedup(tmp_path / "spill", max_memory=1000)
    first = d.check([f"s{i}" for i in range(5000)])
    assert first.all()
    again = d.check([f"s{i}" for i in range(4990, 5010)])
    assert again.tolist() == [False] * 10 + [True] * 10
    assert any(f.startswith("run-") for f in os.listdir(tmp_path / "spill"))


def test_dedup_in_a_fused_pipeline_and_collate():
    d = ExactDedup()
    text, keep = TextPipeline([TextCleaner(), d])(["  a ", "a", None, "b", "a  "])
    assert keep.tolist() == [True, False, False, True, False]
    assert text.filter(keep).to_list() == ["a", "b"]
    collate = make_collate([TextCleaner()], field="text")
    out = collate([{"text": " x "}, {"text": "y\r\n"}])
    assert isinstance(out, StringTensor) and out.to_list() == ["x", "y"]
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader([{"text": f" r{i} "} for i in range(10)], batch_size=4, collate_fn=collate)
    assert [b.to_list() for b in loader][0] == ["r0", "r1", "r2", "r3"]
    assert np.asarray(keep).dtype == bool


def test_make_collate_takes_a_hugging_face_tokenizer_callable():
    """A `transformers` tokenizer is called with the kept texts as HF documents it
    (padding=True, truncation when max_length is set, return_tensors="pt"); its outputs pass
    through. A stand-in with that call signature checks what make_collate passes and returns."""
    torch = pytest.importorskip("torch")
    calls = []

    def hf_tokenizer(texts, padding, truncation, max_length, return_tensors):
        calls.append((list(texts), padding, truncation, max_length, return_tensors))
        n = max(len(t) for t in texts) if max_length is None else max_length
        ids = torch.tensor([[ord(c) for c in t[:n]] + [0] * (n - len(t[:n])) for t in texts])
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "token_type_ids": torch.zeros_like(ids)}

    collate = make_collate([TextCleaner(), ExactDedup()], field="text", tokenizer=hf_tokenizer, max_length=3)
    out = collate([{"text": " ab "}, {"text": "ab"}, {"text": "wxyz"}])
    assert calls == [(["ab", "wxyz"], True, True, 3, "pt")]
    assert out["input_ids"].tolist() == [[97, 98, 0], [119, 120, 121]]
    assert out["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]] and "token_type_ids" in out
    with pytest.raises(TypeError, match="Tokenizer or a callable"):
        make_collate(tokenizer="tokenizer.json")


def _write_parquet(tmp_path, docs, files=3):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    d = tmp_path / "pq"
    d.mkdir()
    per = -(-len(docs) // files)
    for i in range(files):
        part = docs[i * per : (i + 1) * per]
        pq.write_table(pa.table({"id": list(range(i * per, i * per + len(part))), "text": pa.array(part, pa.string())}), d / f"part-{i}.parquet", row_group_size=97)
    return d


def test_parquet_source_resumes_exactly_across_files_and_row_groups(tmp_path):
    from zrecord.text import ParquetSource

    docs = make_docs(1000, seed=3)
    d = _write_parquet(tmp_path, docs)
    state = tmp_path / "state"
    seen = []
    pipe = ResumablePipeline(ParquetSource(d, "text"), [TextCleaner(collapse_whitespace=True)], state_dir=state, batch_size=64, prefetch=2)
    for k, batch in enumerate(pipe):
        seen += batch.positions.tolist()
        pipe.commit({"n": len(seen)})
        if k == 6:
            break
    pipe.close()
    pipe = ResumablePipeline(ParquetSource(str(d / "*.parquet"), "text"), [TextCleaner(collapse_whitespace=True)], state_dir=state, batch_size=64, prefetch=2)
    assert pipe.user_state == {"n": len(seen)}
    texts = []
    for batch in pipe:
        seen += batch.positions.tolist()
        texts += batch.text.to_list()
        pipe.commit({"n": len(seen)})
    pipe.close()
    assert seen == expected(docs, dedup=False)  # every non-null row once, in order
    assert texts[-1] == " ".join(docs[seen[-1]].split())
    # A file changed after the commit: resuming would be wrong, so it is an error.
    st = os.stat(d / "part-1.parquet")
    os.utime(d / "part-1.parquet", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ValueError, match="changed since the last commit"):
        ResumablePipeline(ParquetSource(d, "text"), state_dir=state)
    with pytest.raises(KeyError):
        ParquetSource(d, "nope")
    with pytest.raises(TypeError, match="not a string column"):
        ParquetSource(d, "id")


def test_near_dedup_state_is_committed_with_the_position(tmp_path):
    base = [" ".join(f"w{(d * 7919 + w * 104729) % 5000}" for w in range(40)) for d in range(30)]
    docs = base[:20] + [b.replace("w", "x", 1) for b in base[:20]]
    kw = dict(state_dir=tmp_path / "s", batch_size=5, prefetch=2, near_dedup={"threshold": 0.7})
    p = ResumablePipeline(docs, **kw)
    got = []
    for k, b in enumerate(p):
        got += b.positions.tolist()
        if k == 1:
            p.commit()
        if k == 3:  # two batches delivered past the commit, then a "crash"
            break
    p.close()
    assert got == list(range(20))
    p2 = ResumablePipeline(docs, **kw)
    assert p2.position == 10
    rest = [pos for b in p2 for pos in b.positions.tolist()]
    p2.close()
    # Replayed from the commit: originals 10..19 kept again, near copies of all 20 dropped.
    assert rest == list(range(10, 20))
    # Reopened with other parameters: refused; dedup stages in `stages` are refused too.
    with pytest.raises(ValueError, match="num_perm"):
        ResumablePipeline(docs, **{**kw, "near_dedup": {"threshold": 0.7, "num_perm": 64}})
    with pytest.raises(ValueError, match="NearDedup"):
        ResumablePipeline(docs, [NearDedup()], state_dir=tmp_path / "t")
    with pytest.raises(ValueError, match="ExactDedup"):
        ResumablePipeline(docs, [ExactDedup()], state_dir=tmp_path / "t")
    with pytest.raises(TypeError, match="near_dedup"):
        ResumablePipeline(docs, state_dir=tmp_path / "t", near_dedup="yes")


def test_near_dedup_folder_reopens_at_its_commit(tmp_path):
    base = [" ".join(f"w{(d * 7919 + w * 104729) % 5000}" for w in range(40)) for d in range(10)]
    near = [b.replace("w", "x", 1) for b in base]
    d = NearDedup(0.7, path=tmp_path / "nd")
    assert d.check(StringTensor(base)).all()
    assert d.commit_upto(6) == 6
    del d
    d = NearDedup(0.7, path=tmp_path / "nd")
    assert (len(d), d.committed) == (6, 6)
    assert d.check(StringTensor(near)).tolist() == [False] * 6 + [True] * 4
    with pytest.raises(ValueError, match="shingle=5"):
        NearDedup(0.7, shingle=4, path=tmp_path / "nd")

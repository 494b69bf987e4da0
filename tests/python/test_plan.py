"""EpochPlan: an epoch dealt to ranks x workers, resumed exactly on other layouts (elastic
resumption), read by the Loader as one shard's stream."""

import numpy as np
import pytest

import zrecord


def single_stream(plan, epoch):
    """The uninterrupted single-process stream of an epoch, batch by batch."""
    return [plan.ids(epoch, t).tolist() for t in range(plan.batches)]


def round_robin(totals, m):
    """Batches each worker yielded once m were taken round robin (exhausted workers skipped)."""
    counts, left = [0] * len(totals), m
    while left:
        progressed = False
        for w, total in enumerate(totals):
            if left and counts[w] < total:
                counts[w] += 1
                left -= 1
                progressed = True
        assert progressed, "more consumed than dealt"
    return counts


def consume(deal, m):
    """The batches every rank's DataLoader yields first (m per rank), as lists of ids."""
    out = []
    for r in range(deal.ranks):
        totals = [deal.shard_len(r, w) for w in range(deal.workers)]
        for w, c in enumerate(round_robin(totals, m)):
            out += [deal.ids(r, w, i).tolist() for i in range(c)]
    return out


@pytest.mark.parametrize("mode", ["cyclic", "sequential", "iid"])
def test_two_by_two_then_three_by_one_then_one_by_four_equals_the_single_process_stream(mode):
    plan = zrecord.EpochPlan(1003, 16, mode, seed=11)
    assert (len(plan), plan.batches, plan.batch_size, plan.mode) == (1003, 63, 16, mode)
    seen = []
    d = plan.deal(2, 2)
    seen += consume(d, 6)
    p = d.position_after([6, 6])
    assert p["epoch"] == 0 and p["done"] == 12
    d = plan.deal(3, 1, p)
    seen += consume(d, 5)
    p = d.position_after([5, 5, 5])
    d = plan.deal(1, 4, p)
    rest = d.rank_len(0)
    assert rest == 63 - 12 - 15
    seen += consume(d, rest)
    assert d.position_after([rest]) == {"epoch": 1, "done": 0, "extra": []}
    # The same batches as the uninterrupted stream: none twice, none skipped.
    assert sorted(seen) == sorted(single_stream(plan, 0))
    if mode != "iid":
        assert sorted(i for b in seen for i in b) == list(range(1003))


def test_the_cyclic_order_is_a_fresh_permutation_per_epoch_and_matches_the_sampler():
    plan = zrecord.EpochPlan(100, 8, "cyclic", seed=3)
    e0, e1 = np.concatenate(single_stream(plan, 0)), np.concatenate(single_stream(plan, 1))
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(100)) and not np.array_equal(e0, e1)
    np.testing.assert_array_equal(e1, zrecord.Sampler(100, 1, "cyclic", seed=3).epoch_order(1, 0, 100))
    # 2 ranks x 2 workers: step i of shard s is base batch i*4 + s, i.e. the global batch of
    # 32 that Sampler(100, 32) draws at step i, sliced.
    d = plan.deal(2, 2)
    g = zrecord.Sampler(100, 32, "cyclic", seed=3)
    for i in range(3):
        want = g.batch(i)
        for s in range(4):
            np.testing.assert_array_equal(d.ids(s // 2, s % 2, i), want[s * 8:(s + 1) * 8])


def test_uneven_consumption_and_positions_from_checkpoints_are_checked():
    plan = zrecord.EpochPlan(64, 4, "sequential")
    d = plan.deal(2, 2)
    p = d.position_after([1, 2])  # rank 0 one batch behind
    assert p == {"epoch": 0, "done": 1, "extra": [2, 3]}
    resumed = plan.deal(1, 1, p)
    assert [resumed.shard_batch(0, 0, i) for i in range(3)] == [1, 4, 5]
    for bad in (
        {"epoch": 0, "done": 17, "extra": []},
        {"epoch": 0, "done": 1, "extra": [1]},
        {"epoch": 0, "done": 0, "extra": [3, 2]},
        {"epoch": -1, "done": 0, "extra": []},
        {"epoch": 0, "done": 0},
        {"epoch": 0, "done": 0, "extra": ["x"]},
        [0, 0, []],
    ):
        with pytest.raises(ValueError):
            plan.deal(1, 1, bad)
    with pytest.raises(ValueError):
        d.position_after([1])  # two ranks
    with pytest.raises(ValueError):
        d.position_after([99, 0])
    with pytest.raises(ValueError):
        plan.deal(0, 1)
    with pytest.raises(ValueError):
        d.ids(0, 2, 0)
    with pytest.raises(ValueError):
        zrecord.EpochPlan(0, 4)
    with pytest.raises(ValueError):
        zrecord.EpochPlan(10, 4, "shuffled")


def test_drop_last_gives_every_shard_as_many_full_batches():
    plan = zrecord.EpochPlan(100, 8, "cyclic", seed=1, drop_last=True)
    d = plan.deal(5, 1)
    assert plan.batches == 12 and [d.rank_len(r) for r in range(5)] == [2] * 5
    assert all(len(d.ids(r, 0, i)) == 8 for r in range(5) for i in range(2))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_reads_a_shard_stream_across_epochs(tmp_path, workers):
    data = np.arange(45, dtype=np.int64).reshape(45, 1) * 10
    with zrecord.DenseWriter(tmp_path / "x", np.int64, (1,), "raw") as w:
        w.append(data)
    view = zrecord.DenseStore(tmp_path / "x").bind(zrecord.Allocator())
    plan = zrecord.EpochPlan(45, 4, "cyclic", seed=5)
    d = plan.deal(3, 1, {"epoch": 2, "done": 1, "extra": [3]})
    stream = d.stream(2, 0)
    assert (stream.first_len, stream.epoch_len) == (3, 4)  # 10 of 12 left: 4, 3, 3; then 4 each
    with zrecord.Loader({"x": [view]}, stream, workers=workers, prefetch=2) as loader:
        got = [np.from_dlpack(next(loader)[0]["x"])[:, 0] // 10 for _ in range(8)]
        state = loader.state_dict()
        assert state == {"step": 8}
        loader.load_state_dict({"step": 2})
        again = np.from_dlpack(next(loader)[0]["x"])[:, 0] // 10
    for k, ids in enumerate(got):
        np.testing.assert_array_equal(ids, stream.ids(k))
    np.testing.assert_array_equal(again, got[2])
    assert [stream.locate(k)[0] for k in range(8)] == [2, 2, 2, 3, 3, 3, 3, 4]
    # Shard 2 reads base batches 4, 7, 10 of epoch 2, then 2, 5, 8, 11 of each later epoch;
    # batch 11 holds the 45th record alone.
    assert [stream.locate(k)[1] for k in range(8)] == [4, 7, 10, 2, 5, 8, 11, 2]
    assert [len(ids) for ids in got] == [4, 4, 4, 4, 4, 4, 1, 4]
    with pytest.raises(ValueError):
        zrecord.Loader({"x": [view, view]}, stream)  # the plan dealt positions already


def _dense(path, values):
    with zrecord.DenseWriter(path, np.int64, (1,), "raw") as w:
        w.append(np.asarray(values, dtype=np.int64).reshape(-1, 1))
    return zrecord.DenseStore(path).bind(zrecord.Allocator())


def _ragged(path, lens, tag):
    recs = [np.full(n, tag * 1000 + i, dtype=np.int32) for i, n in enumerate(lens)]
    with zrecord.RaggedWriter(path, np.int32, 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(recs))
    return zrecord.RaggedStore(path).bind(zrecord.Allocator())


def test_a_mixture_holds_each_source_at_its_weight_in_every_window(tmp_path):
    web = _dense(tmp_path / "web", np.arange(500) + 10_000)
    code = _dense(tmp_path / "code", np.arange(40) + 20_000)
    mix = zrecord.Mixture({"web": ({"x": web}, 7), "code": ({"x": code}, 3)}, batch_size=20, seed=3)
    assert mix.sources == ["web", "code"] and mix.starts == [0, 500] and len(mix) == 540
    assert mix.shares == {"web": 0.7, "code": 0.3}
    floats = zrecord.Mixture({"web": ({"x": web}, 0.7), "code": ({"x": code}, 0.3)}, batch_size=20)
    assert abs(floats.shares["web"] - 0.7) < 1e-4
    steps = [mix.batch(s) for s in range(60)]
    for w in (1, 5, 17):
        for start in range(0, 60 - w):
            ids = np.concatenate(steps[start:start + w])
            src = mix.source_of(ids)
            assert abs((src == 1).sum() - 0.3 * len(ids)) <= 2
    # Each source walks its own epochs: 360 code records = 9 epochs of 40, each a permutation.
    code_ids = np.concatenate(steps)[np.concatenate([mix.source_of(s) for s in steps]) == 1] - 500
    assert len(code_ids) == 360 and all(sorted(e) == list(range(40)) for e in code_ids.reshape(9, 40).tolist())
    assert mix.epochs(60) == {"web": 1, "code": 9} and mix.consumed(60) == {"web": 840, "code": 360}
    # Through the Loader, sliced over 2 ranks with workers: the values are the mixed records.
    got = []
    for rank in range(2):
        with zrecord.Loader(mix.streams, mix, workers=2, rank=rank, world_size=2) as loader:
            got.append([np.from_dlpack(next(loader)[0]["x"])[:, 0] for _ in range(6)])
    for s in range(6):
        want = np.where(steps[s] < 500, steps[s] + 10_000, steps[s] - 500 + 20_000)
        np.testing.assert_array_equal(np.concatenate([got[0][s], got[1][s]]), want)
    # A step number is the whole state: a new loader resumes at step 4 exactly.
    with zrecord.Loader(mix.streams, mix, workers=2) as loader:
        for _ in range(4):
            next(loader)
        state = loader.state_dict()
    with zrecord.Loader(mix.streams, mix, workers=1) as again:
        again.load_state_dict(state)
        resumed = np.from_dlpack(next(again)[0]["x"])[:, 0]
    np.testing.assert_array_equal(resumed, np.where(steps[4] < 500, steps[4] + 10_000, steps[4] - 500 + 20_000))


def test_a_token_mixture_weighs_sources_by_tokens(tmp_path):
    rng = np.random.default_rng(0)
    short = _ragged(tmp_path / "short", rng.integers(1, 20, 300), 1)   # ~10 tokens a record
    long = _ragged(tmp_path / "long", rng.integers(50, 150, 100), 2)   # ~100 tokens a record
    mix = zrecord.Mixture({"short": (short, 1), "long": (long, 1)}, batch_size=32, by="tokens", seed=1)
    tokens = {"short": 0, "long": 0}
    with zrecord.Loader(mix.streams, mix, workers=0) as loader:
        for _ in range(300):
            b = next(loader)[0]["data"]
            values = np.from_dlpack(b.values)
            tokens["short"] += int((values < 2000).sum())
            tokens["long"] += int((values >= 2000).sum())
    share = tokens["short"] / (tokens["short"] + tokens["long"])
    assert 0.45 < share < 0.55, tokens
    assert mix.shares["short"] > 0.85  # many more short records for as many tokens


def test_mixture_errors(tmp_path):
    a = _dense(tmp_path / "a", np.arange(10))
    b = _ragged(tmp_path / "b", [1, 2, 3], 0)
    with pytest.raises(ValueError, match="same streams"):
        zrecord.Mixture({"a": ({"x": a}, 1), "b": ({"y": a}, 1)}, batch_size=4)
    with pytest.raises(ValueError):
        zrecord.Mixture({"a": ({"x": a}, 1), "b": ({"x": b}, 1)}, batch_size=4)  # dense vs ragged
    with pytest.raises(ValueError):
        zrecord.Mixture({"a": (a, 0), "b": (a, 1)}, batch_size=4)
    with pytest.raises(TypeError):
        zrecord.Mixture({"a": a}, batch_size=4)
    with pytest.raises(ValueError):
        zrecord.Mixture({}, batch_size=4)
    with pytest.raises(ValueError, match="ragged"):
        zrecord.Mixture({"a": (a, 1)}, batch_size=4, by="tokens")
    mix = zrecord.Mixture({"a": (a, 1), "a2": (a, 3)}, batch_size=8, mode="sequential", max_epochs=1)
    with zrecord.Loader(mix.streams, mix, workers=0) as loader:
        next(loader)
        with pytest.raises(ValueError, match="source 1 is exhausted"):
            for _ in range(3):
                next(loader)


def reference_pack(docs, order, rows, seq_len, lookahead, pad_id, steps):
    """An independent plain-Python first-fit packer (the documented algorithm)."""
    window, cursor, out = [], 0, []
    for _ in range(steps):
        while len(window) < lookahead:
            window.append([order[cursor % len(order)], 0])
            cursor += 1
        used = [0] * rows
        segs = [[] for _ in range(rows)]
        for entry in window:
            d, off = entry
            total = len(docs[d])
            while off < total:
                rem = total - off
                if rem <= seq_len:
                    r = next((r for r in range(rows) if seq_len - used[r] >= rem), None)
                else:
                    r = next((r for r in range(rows) if used[r] == 0), None)
                if r is None:
                    break
                n = min(rem, seq_len)
                segs[r].append((d, off, n))
                used[r] += n
                off += n
            entry[1] = off
        window = [e for e in window if e[1] < len(docs[e[0]])]
        tokens = np.full((rows, seq_len), pad_id, dtype=np.int32)
        pos = np.zeros((rows, seq_len), dtype=np.int64)
        ids = np.full((rows, seq_len), -1, dtype=np.int64)
        cu = [0]
        for r in range(rows):
            at = 0
            for d, off, n in segs[r]:
                tokens[r, at:at + n] = docs[d][off:off + n]
                pos[r, at:at + n] = np.arange(off, off + n)
                ids[r, at:at + n] = d
                at += n
                cu.append(r * seq_len + at)
            if at < seq_len:
                cu.append((r + 1) * seq_len)
        out.append((tokens, pos, ids, np.array(cu, dtype=np.int32)))
    return out


def test_packing_matches_the_reference_and_resumes_exactly(tmp_path):
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 50_000, int(n), dtype=np.int32) for n in rng.integers(0, 300, 200)]
    with zrecord.RaggedWriter(tmp_path / "docs", np.int32, 1, "zstd", allow_empty=True) as w:
        w.append(zrecord.RaggedBatch.from_records(docs))
    view = zrecord.RaggedStore(tmp_path / "docs").bind(zrecord.Allocator())
    order = zrecord.Sampler(200, 1, "cyclic", seed=9).epoch_order(0, 0, 200).tolist()
    order += zrecord.Sampler(200, 1, "cyclic", seed=9).epoch_order(1, 0, 200).tolist()
    want = reference_pack(docs, order, rows=4, seq_len=256, lookahead=16, pad_id=-7, steps=40)
    packer = zrecord.Packer(view, 256, rows=4, mode="cyclic", seed=9, lookahead=16, pad_id=-7)
    got = [next(packer) for _ in range(40)]
    for (tokens, pos, ids, cu), b in zip(want, got):
        np.testing.assert_array_equal(np.from_dlpack(b["tokens"]), tokens)
        np.testing.assert_array_equal(np.from_dlpack(b["position_ids"]), pos)
        np.testing.assert_array_equal(np.from_dlpack(b["document_ids"]), ids)
        np.testing.assert_array_equal(np.from_dlpack(b["cu_seqlens"]), cu)
        assert b["efficiency"] == (ids >= 0).mean()
    real = sum(int((ids >= 0).sum()) for _, _, ids, _ in want)
    assert packer.efficiency == real / (40 * 4 * 256) and packer.efficiency > 0.8 and packer.epoch == 1
    # Resume from the state after step 25: the same 15 batches follow.
    again = zrecord.Packer(view, 256, rows=4, mode="cyclic", seed=9, lookahead=16, pad_id=-7)
    for _ in range(25):
        next(again)
    state = again.state_dict()
    assert set(state) == {"step", "base", "cursor", "window", "rank", "world_size"} and len(state["window"]) <= 16
    resumed = zrecord.Packer(view, 256, rows=4, mode="cyclic", seed=9, lookahead=16, pad_id=-7)
    resumed.load_state_dict(state)
    for k in range(25, 40):
        np.testing.assert_array_equal(np.from_dlpack(next(resumed)["tokens"]), want[k][0])


def _placed(batch, docs):
    """(document, offset) of every real token of a packed batch, checking each token's value."""
    tokens = np.from_dlpack(batch["tokens"]).ravel()
    ids = np.from_dlpack(batch["document_ids"]).ravel()
    pos = np.from_dlpack(batch["position_ids"]).ravel()
    real = ids >= 0
    for t, d, k in zip(tokens[real], ids[real], pos[real]):
        assert t == docs[d][k]
    return list(zip(ids[real].tolist(), pos[real].tolist()))


@pytest.mark.parametrize("worlds", [(2, 3, 1), (3, 2, 4), (1, 4, 4)])
def test_packing_resumes_on_another_world_size_without_losing_or_repeating_a_token(tmp_path, worlds):
    rng = np.random.default_rng(sum(worlds))
    docs = [rng.integers(1, 50_000, int(n), dtype=np.int32) for n in rng.integers(0, 120, 400)]
    with zrecord.RaggedWriter(tmp_path / "docs", np.int32, 1, "zstd", allow_empty=True) as w:
        w.append(zrecord.RaggedBatch.from_records(docs))
    view = zrecord.RaggedStore(tmp_path / "docs").bind(zrecord.Allocator())

    def packer(rank, world):
        return zrecord.Packer(view, 128, rows=2, mode="sequential", lookahead=8, pad_id=-1, rank=rank, world_size=world)

    placed, states = [], None
    for phase, world in enumerate(worlds):
        ranks = [packer(r, world) for r in range(world)]
        if states is not None:
            dealt = ranks[0].reshard(states, world)
            for r, p in enumerate(ranks):
                p.load_state_dict(states[::-1])  # every old rank's state, any order
                assert p.state_dict() == dealt[r]
        for r, p in enumerate(ranks):
            for _ in range(3 + r + phase):  # ranks pull their streams to different depths
                placed += _placed(next(p), docs)
        states = [p.state_dict() for p in ranks]
    # What the job pulled from the sequential stream: every position below the last base, and
    # each last rank's positions base + j * world + rank, j < cursor; with what waits in the
    # windows, the placed tokens are all their tokens, each exactly once.
    base, world = states[0]["base"], states[0]["world_size"]
    pulled = list(range(base)) + [base + j * world + s["rank"] for s in states for j in range(s["cursor"])]
    assert max(pulled) < len(docs), "the test stays inside one epoch"
    for s in states:
        placed += [(d, k) for d, off in s["window"] for k in range(off, len(docs[d]))]
    want = sorted((d, k) for d in pulled for k in range(len(docs[d])))
    assert len(placed) == len(set(placed)), "no token twice"
    assert sorted(placed) == want


def test_packer_errors(tmp_path):
    with zrecord.DenseWriter(tmp_path / "d", np.int32, (4,), "raw") as w:
        w.append(np.zeros((3, 4), np.int32))
    dense = zrecord.DenseStore(tmp_path / "d").bind(zrecord.Allocator())
    with pytest.raises(ValueError, match="ragged"):
        zrecord.Packer(dense, 8)
    tok = _ragged(tmp_path / "t", [3, 4, 5], 0)
    for kwargs in ({"seq_len": 0}, {"seq_len": 8, "rows": 0}, {"seq_len": 8, "lookahead": 0}, {"seq_len": 8, "pad_id": 2**40}, {"seq_len": 8, "rank": 1}):
        with pytest.raises(ValueError):
            zrecord.Packer(tok, **kwargs)
    p = zrecord.Packer(tok, 8)
    for bad in ({"step": 0, "cursor": 0, "window": [[9, 0]]}, {"step": 0, "cursor": 0, "window": [[0, 99]]}, {"step": -1, "cursor": 0, "window": []}, {"cursor": 0}, [1]):
        with pytest.raises(ValueError):
            p.load_state_dict(bad)
    other = zrecord.Packer(tok, 8, rank=1, world_size=2).state_dict()
    with pytest.raises(ValueError, match="rank 1's of 2"):
        p.load_state_dict(other)  # another rank's state alone
    with pytest.raises(ValueError, match="2 states were given|rank"):
        p.load_state_dict([other, other])
    with pytest.raises(TypeError):
        p.load_state_dict(7)


def test_block_mode_samples_whole_blocks_a_window_at_a_time():
    s = zrecord.Sampler(1000, 40, "block", seed=2, block=10, window=4)
    assert s.mode == "block" and s.batch_size == 40
    order = s.epoch_order(0, 0, 1000)
    assert sorted(order.tolist()) == list(range(1000))
    for w in range(25):  # each window of 40 positions: 4 whole blocks, shuffled together
        ids = order[w * 40:(w + 1) * 40]
        blocks = np.unique(ids // 10)
        assert len(blocks) == 4 and sorted(ids.tolist()) == sorted(i for b in blocks for i in range(b * 10, b * 10 + 10))
    np.testing.assert_array_equal(s.batch(25 + 3), s.epoch_order(1, 120, 160))  # cycle 1, batch 3
    assert not np.array_equal(order, s.epoch_order(1, 0, 1000))
    import pickle

    t = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(t.batch(7), s.batch(7))
    with pytest.raises(ValueError):
        zrecord.Sampler(100, 4, "block", block=0)
    # The epoch plan, mixtures and packing take the mode too.
    plan = zrecord.EpochPlan(1000, 40, "block", seed=2)
    assert sorted(np.concatenate([plan.ids(0, t) for t in range(plan.batches)]).tolist()) == list(range(1000))


def test_packing_a_mixture_follows_its_slots_exactly(tmp_path):
    rng = np.random.default_rng(8)
    a_docs = [rng.integers(1, 100, int(n), dtype=np.int32) for n in rng.integers(1, 40, 50)]
    b_docs = [rng.integers(1000, 1100, int(n), dtype=np.int32) for n in rng.integers(30, 90, 20)]
    for name, docs in (("a", a_docs), ("b", b_docs)):
        with zrecord.RaggedWriter(tmp_path / name, np.int32, 1, "raw") as w:
            w.append(zrecord.RaggedBatch.from_records(docs))
    views = {k: zrecord.RaggedStore(tmp_path / k).bind(zrecord.Allocator()) for k in "ab"}
    mix = zrecord.Mixture({"a": ({"tokens": views["a"]}, 3), "b": ({"tokens": views["b"]}, 1)}, batch_size=8, seed=2)
    order = np.concatenate([mix.batch(s) for s in range(100)]).tolist()
    want = reference_pack(a_docs + b_docs, order, rows=2, seq_len=64, lookahead=8, pad_id=0, steps=30)
    packer = zrecord.Packer(mix, 64, rows=2, lookahead=8)
    for tokens, pos, ids, cu in want:
        b = next(packer)
        np.testing.assert_array_equal(np.from_dlpack(b["tokens"]), tokens)
        np.testing.assert_array_equal(np.from_dlpack(b["document_ids"]), ids)
    with pytest.raises(ValueError):
        zrecord.Packer(mix, 64, mode="cyclic")

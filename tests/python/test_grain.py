"""zrecord.grain.DataSource as a Grain RandomAccessDataSource: values against NumPy, Grain's
own MapDataset and DataLoader (with worker processes, which pickle the source)."""

import numpy as np
import pyarrow as pa
import pytest

import zrecord
from zrecord.grain import DataSource

N = 50


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("grain")
    img = np.arange(N * 4, dtype=np.uint8).reshape(N, 2, 2)
    with zrecord.DenseWriter(root / "img.zrec", "uint8", (2, 2), "raw") as w:
        w.append(img)
    tok = [np.arange(i % 4 + 1, dtype=np.int64) + 100 * i for i in range(N)]
    with zrecord.RaggedWriter(root / "tok.zrec", "int64", 1, "zstd") as w:
        w.append(zrecord.RaggedBatch.from_records(tok))
    zrecord.write_dataset(pa.table({"label": np.arange(N, dtype=np.int32), "name": [f"n{i}" for i in range(N)]}), root / "root")
    return root, img, tok


def test_protocol(data):
    root, img, tok = data
    src = DataSource(root / "img.zrec")
    assert len(src) == N
    np.testing.assert_array_equal(src[3], img[3])
    np.testing.assert_array_equal(src[-1], img[-1])
    got = src.__getitems__([4, 0, 4])
    assert len(got) == 3 and all(isinstance(g, np.ndarray) for g in got)
    np.testing.assert_array_equal(np.stack(got), img[[4, 0, 4]])
    rg = DataSource(root / "tok.zrec")
    for i, r in zip([7, 2], rg.__getitems__([7, 2])):
        np.testing.assert_array_equal(r, tok[i])
    ds = DataSource(root / "root")
    assert ds[9] == {"label": 9, "name": "n9"}
    with pytest.raises(IndexError):
        src[N]
    with pytest.raises(TypeError):
        src["3"]


def test_with_grain(data):
    grain = pytest.importorskip("grain")
    root, img, _ = data
    src = DataSource(root / "img.zrec")
    mapped = grain.MapDataset.source(src).shuffle(seed=3).batch(10)
    seen = np.concatenate([np.asarray(b) for b in mapped])
    assert seen.shape == (N, 2, 2)
    assert sorted(map(tuple, seen.reshape(N, 4).tolist())) == sorted(map(tuple, img.reshape(N, 4).tolist()))

    # Grain's worker processes read absl flags; outside absl.app they must be marked parsed.
    from absl import flags

    flags.FLAGS.mark_as_parsed()
    loader = grain.DataLoader(
        data_source=DataSource(root / "root"),
        sampler=grain.samplers.IndexSampler(num_records=N, shuffle=True, seed=1, num_epochs=1),
        worker_count=2,
    )
    rows = list(loader)
    assert sorted(int(r["label"]) for r in rows) == list(range(N))
    assert all(r["name"] == f"n{int(r['label'])}" for r in rows)


def test_ragged_batch_packs_pads_stacks_and_keeps_strings():
    from functools import partial

    from zrecord.grain import ragged_batch

    rng = np.random.default_rng(0)
    recs = [rng.integers(0, 100, (n, 2)).astype(np.int32) for n in (3, 1, 4)]
    elements = [{"x": r, "y": np.float32(k), "s": f"t{k}"} for k, r in enumerate(recs)]
    b = ragged_batch(elements)
    assert b["s"] == ["t0", "t1", "t2"]
    assert b["y"].tolist() == [0.0, 1.0, 2.0] and b["y"].dtype == np.float32
    assert b["x"]["cu_seqlens"].tolist() == [0, 6, 8, 16] and b["x"]["cu_seqlens"].dtype == np.int32
    assert b["x"]["shapes"].tolist() == [[3, 2], [1, 2], [4, 2]] and b["x"]["shapes"].dtype == np.uint64
    np.testing.assert_array_equal(b["x"]["values"], np.concatenate([r.ravel() for r in recs]))
    # The packed batch reads back through RaggedBatch like a gathered one.
    rb = zrecord.RaggedBatch(b["x"]["values"], b["x"]["cu_seqlens"], b["x"]["shapes"])
    for got, want in zip(rb.to_tensors(), recs):
        np.testing.assert_array_equal(np.from_dlpack(got), want)
    p = partial(ragged_batch, pad_value=-1)([r for r in recs])
    assert p["values"].shape == (3, 4, 2)
    for k, r in enumerate(recs):
        np.testing.assert_array_equal(p["values"][k, : len(r)], r)
        assert (p["values"][k, len(r) :] == -1).all()
    same = ragged_batch([np.arange(3), np.arange(3)])
    assert isinstance(same, np.ndarray) and same.shape == (2, 3)
    with pytest.raises(ValueError, match="different ndims"):
        ragged_batch([np.zeros(2), np.zeros((2, 2))])
    with pytest.raises(ValueError, match="no records"):
        ragged_batch([])


def test_epoch_sampler_batches_are_the_plan_and_resume_on_another_shard_count(data):
    grain = pytest.importorskip("grain")
    from zrecord.grain import EpochSampler

    root, img, _ = data
    src = DataSource(root / "img.zrec")
    ids_of = lambda batch: (np.asarray(batch)[:, 0, 0] // 4).tolist()  # record i's first byte is 4i
    plan = zrecord.EpochPlan(N, 4, "cyclic", seed=5, drop_last=True)

    def run(sampler, shard, steps=None):
        loader = grain.DataLoader(data_source=src, sampler=sampler, operations=[grain.transforms.Batch(4)], worker_count=0,
                                  shard_options=grain.sharding.ShardOptions(shard_index=shard, shard_count=sampler.shard_count))
        it = iter(loader)
        return [ids_of(next(it)) for _ in range(steps)] if steps is not None else [ids_of(b) for b in it]

    # Two shards, 2 batches each, then the rest of epoch 0 on three shards.
    seen = []
    for shard in range(2):
        s = EpochSampler(N, 4, shard_index=shard, shard_count=2, seed=5)
        got = run(s, shard, 2)
        assert got == [plan.deal(2, 1).ids(shard, 0, i).tolist() for i in range(2)]
        seen += got
    position = s.position_after(2)
    assert position == {"epoch": 0, "done": 4, "extra": []}
    for shard in range(3):
        seen += run(EpochSampler(N, 4, shard_index=shard, shard_count=3, seed=5, position=position), shard)
    # No batch twice, none skipped, except the incomplete last round: the 8 batches left are
    # dealt to 3 shards as 2 full rounds (every shard reads as many), batches 10 and 11 drop.
    assert sorted(seen) == sorted(plan.ids(0, t).tolist() for t in range(10))
    many = EpochSampler(N, 4, seed=5, num_epochs=3)
    assert len(many) == 3 * 12 * 4 and many.position_after(13) == {"epoch": 1, "done": 1, "extra": []}
    with pytest.raises(IndexError):
        many[len(many)]
    with pytest.raises(ValueError):
        EpochSampler(N, 4, shard_index=2, shard_count=2)

"""zrecord.torch: map-style Dataset with batched __getitems__, IterableDataset over the Loader
with exact coverage across DataLoader workers (0 and 2) and ranks, resumable state, and
torchdata's StatefulDataLoader. Record i holds i in every stream, so ids can be read back."""

import numpy as np
import pyarrow as pa
import pytest

import zrecord

torch = pytest.importorskip("torch")
ztorch = pytest.importorskip("zrecord.torch")

N = 203  # not a multiple of any batch size used: the remainder must be covered too


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    ids = np.arange(N, dtype=np.int64)
    img = np.repeat(ids.astype(np.float32)[:, None, None], 6, axis=1).reshape(N, 2, 3)
    with zrecord.DenseWriter(root / "img.zrec", "float32", (2, 3), "zstd") as w:
        w.append(img)
    tok = [np.full(i % 5 + 1, i, dtype=np.int32) for i in range(N)]
    with zrecord.RaggedWriter(root / "tok.zrec", "int32", 1, "raw") as w:
        w.append(zrecord.RaggedBatch.from_records(tok))
    zrecord.write_dataset(pa.table({"id": ids, "text": [f"r{i}" for i in range(N)]}), root / "root")
    return root, img, tok


def _ids_of(batch):
    """The record ids a batch carries, whatever the source."""
    if isinstance(batch, dict):
        got = batch["id"].tolist()
        assert batch["text"] == [f"r{i}" for i in got]
        return got
    if isinstance(batch, ztorch.Ragged):
        return [int(r[0]) for r in batch.to_list()]
    return batch[:, 0, 0].long().tolist()


def test_map_dataset_items_and_batches(data):
    root, img, tok = data
    ds = ztorch.Dataset(root / "img.zrec")
    assert len(ds) == N
    assert torch.equal(ds[5], torch.from_numpy(img[5]))
    assert torch.equal(ds[-1], torch.from_numpy(img[-1]))
    b = ds.gather([7, 0, 7, 202])
    assert isinstance(b, torch.Tensor) and b.shape == (4, 2, 3)
    assert torch.equal(b, torch.from_numpy(img[[7, 0, 7, 202]]))
    with pytest.raises(IndexError):
        ds[N]
    with pytest.raises(IndexError):
        ds.__getitems__([0, N])
    with pytest.raises(IndexError):
        ds.gather([0, N])

    rg = ztorch.Dataset(root / "tok.zrec")
    assert torch.equal(rg[9], torch.from_numpy(tok[9]))
    rb = rg.gather([3, 11])
    assert isinstance(rb, ztorch.Ragged) and len(rb) == 2
    assert torch.equal(rb.record(1), torch.from_numpy(tok[11]))
    assert rb.cu_seqlens.tolist() == [0, 4, 6]

    root_ds = ztorch.Dataset(root / "root")
    assert root_ds[4] == {"id": torch.tensor(4), "text": "r4"}
    assert _ids_of(root_ds.gather([9, 2])) == [9, 2]


def test_map_dataset_batches_are_zero_copy(data):
    root, img, _ = data
    alloc = zrecord.Allocator()
    ds = ztorch.Dataset(zrecord.open(root / "img.zrec").bind(alloc))
    t = ds.gather([1, 2, 3])
    # The tensor holds the pooled allocation itself (no copy): it is live until t is freed.
    assert alloc.stats()["live_bytes"] >= t.numel() * 4
    assert t.data_ptr() % 64 == 0 and t.is_contiguous()
    assert torch.equal(t, torch.from_numpy(img[1:4]))
    del t
    assert alloc.stats()["live_bytes"] == 0


def _double(b):
    return b * 2


def test_getitems_is_a_list_of_samples_for_default_collate(data):
    """torch's contract: __getitems__ returns what ds[i] gives, one per index, so a plain
    DataLoader (default collate, no zrecord collate) works on every source; zrecord's collate
    returns the one-gather batch instead of re-stacking."""
    root, img, tok = data
    ids = [5, 0, 5, 202, 17]
    ds = ztorch.Dataset(root / "img.zrec")
    items = ds.__getitems__(ids)
    assert isinstance(items, list) and len(items) == len(ids)
    for k, i in enumerate(ids):
        assert torch.equal(items[k], ds[i])
    assert ztorch.collate(items) is items.gathered
    assert torch.equal(torch.utils.data.default_collate(items), torch.from_numpy(img[ids]))
    dl = torch.utils.data.DataLoader(ds, batch_size=10)
    got = torch.cat(list(dl))
    assert torch.equal(got, torch.from_numpy(img))
    # A dataset root: a dict per record, collated to a dict of a stacked tensor and strings.
    root_ds = ztorch.Dataset(root / "root")
    items = root_ds.__getitems__(ids)
    assert items[1] == {"id": torch.tensor(0), "text": "r0"}
    seen = []
    for b in torch.utils.data.DataLoader(root_ds, batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(1)):
        assert set(b) == {"id", "text"} and b["text"] == [f"r{i}" for i in b["id"].tolist()]
        seen += b["id"].tolist()
    assert sorted(seen) == list(range(N))
    # Ragged records: one tensor of its own shape per record (stacking them is the caller's
    # choice, as for any variable-length dataset).
    rg = ztorch.Dataset(root / "tok.zrec")
    items = rg.__getitems__([3, 11])
    assert [t.tolist() for t in items] == [tok[3].tolist(), tok[11].tolist()]
    assert isinstance(ztorch.collate(items), ztorch.Ragged)
    # A per-record transform applies to each item; collate then stacks the transformed items.
    tr = ztorch.Dataset(root / "img.zrec", transform=_double)
    items = tr.__getitems__([1, 2])
    assert items.gathered is None
    assert torch.equal(ztorch.collate(items), torch.from_numpy(img[[1, 2]]) * 2)




@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (2, "spawn")])
def test_map_dataset_through_dataloader(data, workers, context):
    root, img, _ = data
    ds = ztorch.Dataset(root / "img.zrec", transform=_double)
    dl = ds.dataloader(batch_size=32, shuffle=True, num_workers=workers, multiprocessing_context=context,
                       generator=torch.Generator().manual_seed(0))
    seen = []
    for b in dl:
        assert b.shape[1:] == (2, 3) and b.shape[0] <= 32
        seen += (b[:, 0, 0] / 2).long().tolist()
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("mode", ["cyclic", "sequential"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("source", ["img.zrec", "tok.zrec", "root"])
def test_iterable_exact_coverage_over_workers_and_ranks(data, mode, workers, source):
    root, _, _ = data
    for epoch in (0, 1):
        seen = []
        for rank in range(2):
            ds = ztorch.IterableDataset(root / source, batch_size=8, mode=mode, seed=5, rank=rank, world_size=2, workers=1)
            ds.set_epoch(epoch)
            dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
            batches = [_ids_of(b) for b in dl]
            assert len(batches) == ds.batches_per_epoch(workers)
            assert all(0 < len(b) <= 8 for b in batches)
            seen += [i for b in batches for i in b]
        assert sorted(seen) == list(range(N)), f"epoch {epoch}: duplicates or gaps"
        if mode == "cyclic":
            order = seen
            if epoch == 0:
                first = order
            else:
                assert order != first, "cyclic epochs must be reshuffled"


def test_iterable_dataloader_helper(data):
    root, img, _ = data
    ds = ztorch.IterableDataset(root / "img.zrec", batch_size=50, mode="sequential", rank=0, world_size=1)
    batches = list(ds.dataloader(num_workers=0))
    assert [b.shape[0] for b in batches] == [50, 50, 50, 50, 3]
    assert torch.equal(torch.cat(batches), torch.from_numpy(img))


def test_iterable_drop_last_and_iid(data):
    root, _, _ = data
    ds = ztorch.IterableDataset(root / "img.zrec", batch_size=16, mode="cyclic", drop_last=True, rank=0, world_size=1)
    batches = [_ids_of(b) for b in ds]
    assert [len(b) for b in batches] == [16] * (N // 16) and len(ds) == N // 16
    assert len(set(i for b in batches for i in b)) == (N // 16) * 16
    iid = list(ztorch.IterableDataset(root / "img.zrec", batch_size=16, mode="iid", rank=0, world_size=1))
    assert len(iid) == -(-N // 16) and all(len(_ids_of(b)) == 16 for b in iid)


def test_iterable_resume_mid_epoch(data):
    root, _, _ = data
    make = lambda: ztorch.IterableDataset(root / "tok.zrec", batch_size=10, mode="cyclic", seed=1, rank=0, world_size=1)
    ds = make()
    ds.set_epoch(3)
    full = [_ids_of(b) for b in ds]
    ds = make()
    ds.set_epoch(3)
    it = iter(ds)
    head = [_ids_of(next(it)) for _ in range(7)]
    state = ds.state_dict()
    assert state == {"epoch": 3, "batches": 7}
    resumed = make()
    resumed.load_state_dict(state)
    rest = [_ids_of(b) for b in resumed]
    assert head + rest == full
    with pytest.raises(ValueError):
        resumed.load_state_dict({"step": 1})


def test_iterable_argument_errors(data):
    root, _, _ = data
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError):
            ztorch.IterableDataset(root / "img.zrec", batch_size=bad)
    with pytest.raises(ValueError):
        ztorch.IterableDataset(root / "img.zrec", batch_size=4, mode="shuffle")
    with pytest.raises(ValueError):
        ztorch.IterableDataset(root / "img.zrec", batch_size=4, rank=2, world_size=2)
    with pytest.raises(TypeError):
        ztorch.Dataset(42)


def test_stateful_dataloader_resume(data):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    root, _, _ = data
    make = lambda: ztorch.IterableDataset(root / "img.zrec", batch_size=8, mode="cyclic", seed=2, rank=0, world_size=1, workers=1)
    full = [_ids_of(b) for b in sdl.StatefulDataLoader(make(), batch_size=None, num_workers=2)]
    assert sorted(i for b in full for i in b) == list(range(N))
    dl = sdl.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    it = iter(dl)
    head = [_ids_of(next(it)) for _ in range(5)]
    state = dl.state_dict()
    del it, dl
    dl2 = sdl.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    dl2.load_state_dict(state)
    rest = [_ids_of(b) for b in dl2]
    assert head + rest == full


@pytest.mark.parametrize("mode", ["cyclic", "iid"])
def test_elastic_resume_on_other_world_sizes_and_worker_counts(data, mode):
    """2 ranks x 2 DataLoader workers for 3 steps, then 3 ranks x 1 worker for 2 steps, then 1
    rank x 4 workers to the end: together exactly the uninterrupted single-process epoch."""
    root, _, _ = data
    make = lambda rank, world: ztorch.IterableDataset(root / "root", batch_size=8, mode=mode, seed=4, rank=rank, world_size=world, workers=1)
    whole = [_ids_of(b) for b in make(0, 1)]  # one process, no DataLoader workers
    assert len(whole) == -(-N // 8)
    seen, position = [], None
    for world, num_workers, steps in ((2, 2, 3), (3, 1, 2), (1, 4, None)):
        positions = set()
        for rank in range(world):
            ds = make(rank, world)
            if position is not None:
                ds.load_state_dict({"position": position})
            dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers)
            if steps is None:
                seen += [_ids_of(b) for b in dl]
                continue
            it = iter(dl)
            seen += [_ids_of(next(it)) for _ in range(steps)]
            del it
            p = ds.elastic_position(steps, num_workers)
            positions.add((p["epoch"], p["done"], tuple(p["extra"])))
        if steps is not None:
            assert len(positions) == 1, "every rank computes the same position"
            epoch, done, extra = positions.pop()
            position = {"epoch": epoch, "done": done, "extra": list(extra)}
    assert sorted(seen) == sorted(whole), "no batch twice, none skipped"
    if mode == "cyclic":
        assert sorted(i for b in seen for i in b) == list(range(N))


def test_elastic_positions_are_checked(data):
    root, _, _ = data
    ds = ztorch.IterableDataset(root / "img.zrec", batch_size=8, rank=0, world_size=1)
    for bad in ({"position": {"epoch": 0, "done": 10**6, "extra": []}}, {"position": {"epoch": 0}}, {"position": [1, 2]}):
        with pytest.raises(ValueError):
            ds.load_state_dict(bad)
    ds.load_state_dict({"position": {"epoch": 2, "done": 20, "extra": [22]}})
    got = [_ids_of(b) for b in ds]
    plan = zrecord.EpochPlan(N, 8, "cyclic", seed=0)
    want = [plan.ids(2, t).tolist() for t in [20, 21] + list(range(23, plan.batches))]
    assert got == want
    assert ds.state_dict() == {"epoch": 2, "batches": len(want), "position": {"epoch": 2, "done": 20, "extra": [22]}}

"""Hostile input to the new surfaces from Python (issue 34): pipeline checkpoints that do not
fit their source, FIFOs where state, tokenizer and Zarr files are expected, rendezvous files
that try to run code, state files behind symlinks. Every case is a typed error, never a hang,
a different stream of rows, or a write through a link."""

from __future__ import annotations

import json
import os
import pickle
import threading

import numpy as np
import pytest

import zrecord
from zrecord.dist import FileComm
from zrecord.text import ExactDedup, ResumablePipeline, Tokenizer

DOCS = [f"doc {i}" for i in range(30)]


def within_time(fn, seconds=20):
    """``fn()``'s result or exception; fails the test if it has not returned in ``seconds``
    (a FIFO opened for reading blocks forever)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} hung"
    return box


def _state(tmp_path, st) -> str:
    d = tmp_path / "state"
    d.mkdir(exist_ok=True)
    (d / "pipeline.json").write_text(st if isinstance(st, str) else json.dumps(st))
    return str(d)


@pytest.mark.parametrize("doc", ["[1, 2]", "17", "null", '"position"', "{not json", "\xff\xfe"])
def test_checkpoints_that_are_not_objects_are_corrupt(tmp_path, doc):
    with pytest.raises(zrecord.CorruptStoreError, match="pipeline"):
        ResumablePipeline(DOCS, state_dir=_state(tmp_path, doc))


@pytest.mark.parametrize("position", [-1, -5, 31, 10**12, True, "3", 2.5, {"file": 0}])
def test_positions_that_do_not_fit_the_source_are_errors_not_other_rows(tmp_path, position):
    with pytest.raises(zrecord.CorruptStoreError, match="position"):
        ResumablePipeline(DOCS, state_dir=_state(tmp_path, {"position": position}))


def test_the_end_of_the_source_is_a_valid_position_and_resumes_to_nothing(tmp_path):
    p = ResumablePipeline(DOCS, state_dir=_state(tmp_path, {"position": 30}))
    assert list(p) == []
    p.close()
    # And a position in range resumes exactly there.
    p = ResumablePipeline(DOCS, state_dir=_state(tmp_path, {"position": 27}), batch_size=10)
    got = [t for b in p for t in b.text.to_list()]
    assert got == DOCS[27:]
    p.close()


@pytest.mark.parametrize("field,value", [("dedup", -1), ("dedup", "7"), ("near_dedup", 1.5), ("commits", -2), ("commits", None)])
def test_stored_counts_are_checked(tmp_path, field, value):
    with pytest.raises(zrecord.CorruptStoreError, match=field):
        ResumablePipeline(DOCS, state_dir=_state(tmp_path, {"position": 0, field: value}), dedup=True, near_dedup=field == "near_dedup")


def test_fifo_checkpoint_and_tokenizer_are_errors_not_hangs(tmp_path):
    d = tmp_path / "fifo-state"
    d.mkdir()
    os.mkfifo(d / "pipeline.json")
    box = within_time(lambda: ResumablePipeline(DOCS, state_dir=str(d)))
    assert isinstance(box.get("error"), zrecord.CorruptStoreError), box
    assert "not a regular file" in str(box["error"])
    os.mkfifo(tmp_path / "tokenizer.json")
    box = within_time(lambda: Tokenizer(str(tmp_path / "tokenizer.json")))
    assert isinstance(box.get("error"), (ValueError, OSError)), box
    assert "not a regular file" in str(box["error"])


def test_fifo_zarr_chunk_is_an_error_not_a_hang(tmp_path):
    zarr = pytest.importorskip("zarr")
    import zrecord.zarr as zz

    z = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(4, 4), chunks=(2, 2), dtype="uint8", zarr_format=2, fill_value=0)
    z[...] = np.arange(16, dtype=np.uint8).reshape(4, 4)
    chunk = tmp_path / "a.zarr" / "0.0"
    assert chunk.exists()
    chunk.unlink()
    os.mkfifo(chunk)
    box = within_time(lambda: zz.read(str(tmp_path / "a.zarr")))
    assert "error" in box and "not a regular file" in str(box["error"]), box


class _Plant:
    """Unpickling this would create a file: the proof that pickle ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_rendezvous_messages_are_data_never_code(tmp_path):
    marker = tmp_path / "pwned"
    rv = tmp_path / "rv"
    rv.mkdir()
    # Rank 1's message for call 0, planted as a pickle that would run code when loaded.
    (rv / "g.0.1").write_bytes(pickle.dumps(_Plant(str(marker))))
    c = FileComm(str(rv), 0, 2, "g", timeout=10)
    with pytest.raises(zrecord.CorruptStoreError, match="rank 1"):
        c.allgather({"a": 1})
    assert not marker.exists()
    # What is sent must be JSON data; JSON round trips (tuples come back as lists).
    with pytest.raises(TypeError, match="JSON"):
        FileComm(str(tmp_path / "solo"), 0, 1, "s").allgather(_Plant(str(marker)))
    solo = FileComm(str(tmp_path / "solo2"), 0, 1, "s")
    assert solo.allgather({"a": (1, 2), "b": None}) == [{"a": [1, 2], "b": None}]
    with pytest.raises(TypeError):
        solo.allgather(float("nan"))


def test_dedup_log_behind_a_symlink_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    state = tmp_path / "dedup"
    state.mkdir()
    os.symlink(victim, state / "dedup.log")
    with pytest.raises((ValueError, OSError), match="symbolic link"):
        ExactDedup(str(state))
    assert victim.read_bytes() == b"precious"

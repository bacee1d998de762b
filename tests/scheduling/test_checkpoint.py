"""Checkpoint files: atomic replacement, a failed write keeps the previous checkpoint, and the automatic interval
keeps writing under 5% of the wall time."""

from __future__ import annotations

import errno

import pytest
import torch

from scheduling import checkpoint


def test_a_checkpoint_round_trips_and_replaces_the_previous_one_atomically(tmp_path):
    checkpoint.write(str(tmp_path), {"meta": {"version": 2}, "x": torch.arange(3)})
    checkpoint.write(str(tmp_path), {"meta": {"version": 4}, "x": torch.arange(5)})
    state = checkpoint.read(str(tmp_path))
    assert state["meta"]["version"] == 4 and state["x"].tolist() == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["meta.json", "state.pt"]


def test_a_full_disk_keeps_the_previous_checkpoint_and_leaves_no_partial_file(tmp_path, monkeypatch):
    checkpoint.write(str(tmp_path), {"meta": {"version": 2}})

    def full(obj, path, **_):
        open(path, "wb").write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.write(str(tmp_path), {"meta": {"version": 4}})
    monkeypatch.undo()
    assert checkpoint.read(str(tmp_path))["meta"]["version"] == 2
    assert not (tmp_path / "checkpoint" / "state.pt.tmp").exists()


def test_the_automatic_interval_waits_twenty_times_the_last_write(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(checkpoint.time, "time", lambda: now[0])
    policy = checkpoint.CheckpointPolicy(every=0)
    now[0] += 59
    assert not policy.due(5)
    now[0] += 2
    assert policy.due(6)
    policy.written(10.0)  # a 10 s write: the next one no sooner than 200 s later (5%)
    now[0] += 199
    assert not policy.due(7)
    now[0] += 2
    assert policy.due(8)
    assert checkpoint.CheckpointPolicy(every=3).due(6) and not checkpoint.CheckpointPolicy(every=3).due(7)
    assert not checkpoint.CheckpointPolicy(every=-1).due(6)

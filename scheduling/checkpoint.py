"""Checkpoints of the server's whole state: one file, written atomically, from which a run continues exactly.

``checkpoint/state.pt`` in the results folder holds everything the run's future depends on: the schedule (the
simulated time, the version counter, every in-flight device with its selection, base version and arrival time,
each device's task count, the device pool with its sampling generator), the updates received but not yet applied,
the global model's kept versions and the buffer of the next one (FedRevive: teachers, estimates, generator, image
pool and their generators too), and how many updates were applied (the length of ``events.jsonl`` to keep).

It is written to a temporary file beside ``state.pt`` and renamed over it: a crash mid-write leaves the previous
checkpoint. After it, ``selection_floor.json`` (also atomic) gives the lowest selection id a resume from it trains
again (its in-flight devices' selections, or the next one); the leaves' store of per-device state
(``processors.device_state``) keeps what those tasks start from. Written after the checkpoint, the floor is never
that of a checkpoint not yet on disk: a crash between the two leaves the previous (lower) floor, which keeps more.
A failed write (a full disk) removes the temporary file, keeps the previous checkpoint and says so; the run goes on.

When: every ``every`` versions, or with ``every`` 0 (the default) whenever at least ``max(60 s, 20 x the last
write's duration)`` of wall time has passed since the last one, so writing costs at most 5% of the run; -1: never.
"""

from __future__ import annotations

import os
import time

import torch

from common.jsonio import replacing, write_json_atomic
from common.protocol import DeviceUpdate, SelectionSum
from common.result_files import CHECKPOINT, SELECTION_FLOOR

PICKLE_PROTOCOL = 4
CHECKPOINT_DIR = CHECKPOINT
STATE_FILE = "state.pt"
AUTO_MIN_SECONDS = 60.0
AUTO_COST_SHARE = 20.0  # wall time between checkpoints >= this x the last write's duration (<= 5% overhead)


def state_path(results_dir: str) -> str:
    return os.path.join(results_dir, CHECKPOINT_DIR, STATE_FILE)


def selection_floor(schedule_state: dict) -> int:
    """The lowest selection id a run resumed from a checkpoint with this schedule state trains again: its in-flight
    devices' selections (issued again with the same ids), else the next selection's."""
    in_flight = [int(d["selection_id"]) for d in schedule_state["in_flight"]]
    return min(in_flight, default=int(schedule_state["selection_seq"]) + 1)


def write(results_dir: str, state: dict) -> float:
    """Write ``state`` atomically; returns the seconds it took. Raises ``OSError`` (the previous one is kept)."""
    started = time.time()
    path = state_path(results_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # pickle protocol 4, not torch's default 2: protocol 2 writes every bytes object (a packed diff, each numpy
    # array's buffer) as a latin-1 string, encoded to UTF-8 on the way (its cost: PERFORMANCE_OPTIMIZATION.md)
    with replacing(path) as tmp:
        torch.save(state, tmp, pickle_protocol=PICKLE_PROTOCOL)
    seconds = time.time() - started
    meta = state["meta"] | {"write_seconds": round(seconds, 4), "bytes": os.path.getsize(path)}
    write_json_atomic(os.path.join(os.path.dirname(path), "meta.json"), meta)  # for people; not read back
    if "schedule" in state:  # after state.pt: see the module docstring
        floor = {"selection_floor": selection_floor(state["schedule"]), "version": state["meta"]["version"]}
        write_json_atomic(os.path.join(os.path.dirname(path), SELECTION_FLOOR), floor)
    return seconds


def read(results_dir: str) -> dict:
    return torch.load(state_path(results_dir), weights_only=False)


class CheckpointPolicy:
    """When the next checkpoint is due (see the module docstring)."""

    def __init__(self, every: int = 0):
        self.every = every
        self.last_wall = time.time()
        self.last_cost = 0.0

    def due(self, version: int) -> bool:
        if self.every < 0:
            return False
        if self.every > 0:
            return version % self.every == 0
        return time.time() - self.last_wall >= max(AUTO_MIN_SECONDS, AUTO_COST_SHARE * self.last_cost)

    def written(self, seconds: float) -> None:
        self.last_wall, self.last_cost = time.time(), seconds


def server_state(applier, schedule, wall_seconds: float) -> dict:
    """The schedule's state and the updates received but not applied (``scheduling.applier.UpdateApplier``: taken
    under its lock), with the run's position (``meta``). The assessor adds the global model's state."""
    with applier.lock:
        received = list(applier.received.values())
        groups = list({id(u.group): u.group for u in received if u.group is not None}.values())
        return {
            "meta": {
                "version": schedule.version,
                "sim_seconds": schedule.now,
                "applied": applier.applied,
                "wall_seconds": wall_seconds,
            },
            "schedule": schedule.state_dict(),
            "received": [
                u.to_dict()
                | {"group": next(i for i, g in enumerate(groups) if g is u.group) if u.group is not None else None}
                for u in received
            ],
            "groups": [g.to_dict() for g in groups],
        }


def restore_received(applier, state: dict) -> None:
    """Put a checkpoint's received updates (a leaf's sums shared again by their devices) and its count of applied
    updates back into a new applier, before it starts."""
    groups = [SelectionSum.from_dict(g) for g in state["groups"]]
    for entry in state["received"]:
        update = DeviceUpdate.from_dict(entry)
        update.group = groups[entry["group"]] if entry["group"] is not None else None
        applier.received[update.device] = update
    applier.applied = state["meta"]["applied"]

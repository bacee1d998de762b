"""When a run cannot make progress because its devices keep failing: the failed updates since the last one that
counted.

A run whose every device fails (a bug in the training code, a model its compute device cannot run) would select,
fail and reselect forever: each failed device frees its slot, a replacement is selected, and no version is made.
The applier (``scheduling.applier``) notes every update it applies here, in the order it applies them; once
``limit`` failed updates in a row, from at least ``limit`` different devices (or every device of the pool when it
holds fewer), came with no update counting since, the run stops (``outcome`` ``stopped``), its reason naming the
count and the last device error.

Which failures count: only a device's own error (``DeviceUpdate.error``: its training raised, a real device
reported an error status, or its result was refused at the leaf). A failure the server decides does not: a device
that goes offline before its update arrives (``--availability``: the schedule's, not an error), a real device
silent past its timeout (it may come back: ``--device-timeout`` handles it), a lost leaf's devices
(``--on-leaf-loss`` decides). Those neither count nor end a streak; only an update that counts ends it.

Why different devices as well as updates in a row: on the wall clock (real devices, ``--time-scale``) a few broken
devices fail at once and may be reselected many times while the healthy ones still train; each counts once. On
exact time the updates are applied in the schedule's order, so a run stops at the same update every time.
"""

from __future__ import annotations


class FailureStreak:
    """Args:
    limit: failed updates in a row (and different devices) that stop the run; 0: never stop.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.failed = 0  # failed updates with an error since the last that counted
        self.devices: set[str] = set()  # the devices they came from
        self.last = ("", "")  # (device, error) of the latest

    def note(self, device: str, counted: bool, error: str) -> None:
        """An applied update: ``counted`` (it went into the model), else failed with ``error`` ("" when the
        server decided it: not counted here)."""
        if counted:
            self.failed, self.devices = 0, set()
        elif error:
            self.failed += 1
            self.devices.add(device)
            self.last = (device, error)

    def reason(self, pool_size: int) -> str:
        """Why the run must stop now, or "" while it may go on (``pool_size``: the devices that can be selected)."""
        if not self.limit or self.failed < self.limit or len(self.devices) < min(self.limit, pool_size):
            return ""
        device, error = self.last
        return (
            f"the run cannot make progress: {self.failed} device updates in a row failed with an error, from "
            f"{len(self.devices)} devices, none counting since (--max-consecutive-failures {self.limit}); the "
            f"last, device {device}: {error}"
        )

"""The server's own check that an update it is about to apply is finite (``common.finite``).

The leaves refuse a device's NaN or inf before anything is summed, and a real device's result as it arrives; the
server checks again whatever sent it (a leaf of another version, a relay, a bug), because one such value would
make the released model NaN. A refused update becomes its device's failure, with the reason, before the schedule
counts it: its slot is freed, the mean of the others is unchanged, and the failure streak sees a device error.
"""

from __future__ import annotations

from collections.abc import Callable

from common.finite import nonfinite_reason
from common.protocol import DeviceUpdate, SelectionSum, short_error


class FiniteUpdates:
    """Args:
    log_error: where a refusal is reported (one line each).
    """

    def __init__(self, log_error: Callable[[str], None]):
        self.log_error = log_error
        # the last leaf sum checked and its verdict: a sum's devices are applied one after another, checked once
        self._last_sum: tuple[SelectionSum | None, str] = (None, "")

    def checked(self, update: DeviceUpdate) -> DeviceUpdate:
        """``update``, or its device counted failed when what it adds holds NaN or inf. A leaf's sum of a
        synchronous selection refuses all its devices: the server cannot tell whose value it was."""
        if update.count <= 0:
            return update
        if update.group is None:
            problem = nonfinite_reason(update.diff, "refused by the server")
        else:
            if self._last_sum[0] is not update.group:
                self._last_sum = (
                    update.group,
                    nonfinite_reason(update.group.diff, "its leaf's sum refused by the server"),
                )
            problem = self._last_sum[1]
        if not problem:
            return update
        self.log_error(f"device {update.device} is counted failed: {problem}")
        return DeviceUpdate(
            update.device, update.selection_id, update.base_version, None, 0, error=short_error(problem), run=update.run
        )

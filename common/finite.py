"""Non-finite values never reach a model: the one check every place that lets an update in applies.

A NaN or an infinity passes every comparison a clip makes (``norm > C`` is false for a NaN norm), so one such
update would make the released model NaN, with or without DP, and DP's sensitivity would be unbounded. A device's
update is therefore checked where it leaves its device (the leaf, for simulated devices, before summing; a real
device's result as the leaf receives it, ``common.device_wire``; the project's own device client before it sends),
and again where the server applies it (``scheduling.applier``). A failed check counts the device failed, with the
reason below, as a training error does: its slot is freed, the mean of the others is unchanged, and a run whose
devices all fail stops naming it (``scheduling.failure_streak``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

NOT_FINITE = "its update holds NaN or inf"  # the start of every reason given, so a test or a reader can find it


def nonfinite_entry(arrays: Mapping[str, object]) -> str:
    """The name of the first array of ``arrays`` holding a NaN or an infinity, or "" when all are finite.

    One sum per array, not an elementwise test: any NaN or infinity makes the sum NaN or infinite (so does a sum
    of finite values so large it overflows float32, which is refused too: no model can use it)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and overflow are what is looked for
        for name, value in arrays.items():
            a = np.asarray(value)
            if a.dtype.kind == "f" and a.size and not np.isfinite(a.sum()):
                return name
    return ""


def nonfinite_reason(arrays: Mapping[str, object], where: str) -> str:
    """Why an update is refused (``where``: who refused it, e.g. "refused at its leaf"), or "" when finite."""
    name = nonfinite_entry(arrays)
    return f"{NOT_FINITE} (entry {name!r}): {where}" if name else ""


def zeroed(arrays: Mapping[str, object]) -> dict[str, np.ndarray]:
    """The same entries, all zeros: what a failed device's update holds (it counts nothing)."""
    return {k: np.zeros(np.shape(v), dtype=np.float32) for k, v in arrays.items()}

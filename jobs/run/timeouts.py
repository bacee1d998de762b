"""The timeouts a run derives from what a leaf sends, not fixed: how long a leaf waits for its parent to take a
report, and how long the server waits before it counts a silent leaf lost (``derive_timeouts``, called by the
run's plan, ``jobs.run.plan``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

LINK_BYTES_PER_SECOND = 100e6  # a conservative rate for a leaf's report to its parent (loopback does far more)
MIN_UPDATE_TIMEOUT = 10.0
MIN_LEAF_TIMEOUT = 60.0
HUG_JITTER = 0.5  # NVFlare's leaves wait update_interval + uniform(0, 0.5) s between syncs (executors/hug.py)


@dataclass(frozen=True)
class Timeouts:
    """Attributes:
    update_timeout: seconds a leaf waits for its parent to take a report: 3x the time the largest report (every
        device of a round as its own diff, or one sum per selection) takes at ``LINK_BYTES_PER_SECOND``, at least
        ``MIN_UPDATE_TIMEOUT``.
    leaf_timeout: seconds of silence after which the server counts a leaf lost: 20 sync periods, twice the
        update timeout, at least ``MIN_LEAF_TIMEOUT`` (a leaf syncs even while its devices train).
    reason: how they were derived, for the console and ``metrics.json``.
    """

    update_timeout: float
    leaf_timeout: float
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def derive_timeouts(
    model_bytes: int,
    devices_per_leaf: int,
    leaf_sums: bool,
    update_interval: float,
    update_timeout: float | None = None,
    leaf_timeout: float | None = None,
) -> Timeouts:
    payload = model_bytes * (1 if leaf_sums else devices_per_leaf)
    derived_update = max(MIN_UPDATE_TIMEOUT, 3 * payload / LINK_BYTES_PER_SECOND)
    update = update_timeout or round(derived_update, 1)
    derived_leaf = max(MIN_LEAF_TIMEOUT, 20 * (update_interval + HUG_JITTER), 2 * update)
    leaf = leaf_timeout or round(derived_leaf, 1)
    reason = (
        f"largest report {payload / 2**20:.1f} MiB ({'one sum per selection' if leaf_sums else 'every device'}"
        f"); update timeout {update:g} s{' (--update-timeout)' if update_timeout else ''}, leaf lost after "
        f"{leaf:g} s of silence{' (--leaf-timeout)' if leaf_timeout else ''}"
    )
    return Timeouts(update, leaf, reason)

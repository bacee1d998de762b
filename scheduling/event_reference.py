"""The reference event trace of a run: ``ExactSchedule`` alone, with no NVFlare and no training.

Every update arrives the moment the schedule asks for it, so the trace is the schedule's semantics and nothing
else. A real run (``events.jsonl`` next to ``metrics.json``, one line per applied update) must reproduce it
exactly: the NVFlare plumbing (leaves, relays, reports, the server waiting for late reports) may delay wall time,
never the order, the versions trained or the simulated times. ``tests/e2e/test_exact_time.py`` compares the two.
"""

from __future__ import annotations

from collections.abc import Callable

from common.delays import DelayConfig, DeviceDelays
from scheduling.device_pool import DevicePool
from scheduling.schedule import ExactSchedule
from scheduling.selection import SelectionPolicy


def make_schedule(
    delays: DelayConfig,
    seed: int,
    leaves: dict[str, int],
    selection_size: int,
    updates_per_version: int,
    min_hole_to_fill: int,
    device_reuse: bool = True,
    max_model_version: int | None = None,
    max_sim_time: float | None = None,
    policy: SelectionPolicy | None = None,
    work: Callable[[str], float] | None = None,
    one_update_per_version: bool = False,
) -> ExactSchedule:
    """A schedule over ``leaves`` (leaf name -> devices, registered as ranges ``<leaf>#0..``), not yet started;
    ``work``: the samples each device trains on per task, when its time scales with them (``common.delays``);
    ``one_update_per_version``: as ``ExactSchedule``'s (differential privacy)."""
    return ExactSchedule(
        DevicePool(seed, leaves),
        DeviceDelays(delays, seed, work),
        selection_size,
        updates_per_version,
        min_hole_to_fill,
        device_reuse,
        max_model_version,
        max_sim_time,
        policy,
        one_update_per_version,
    )


def reference_trace(schedule: ExactSchedule) -> list[dict]:
    """Run a fresh schedule to its end; the trace records, one per applied update, in order."""
    schedule.start()
    trace = []
    while not schedule.done:
        arrival, _ = schedule.apply(schedule.next_due().device)
        trace.append(arrival.trace_record())
    return trace

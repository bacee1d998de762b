"""The timing-only planner: a run's whole event trace from its schedule alone, without training or NVFlare.

A run on exact simulated time applies its updates in the order ``scheduling.schedule.ExactSchedule`` decides, and
that order depends on the seed, the delay model, K, B, the minimum hole and the fleet only, never on training.
So the trace a real run will write (``events.jsonl``) can be computed first, in seconds: researchers use it to
choose K, B and a time budget before spending GPU hours (``--dry-run`` on the jobs). ``timeline_summary`` says
what the trace means: versions per simulated time unit, the staleness histogram, the failure rate and how busy the
fleet is.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field

from common.result_files import EVENTS, TIMELINE
from scheduling.schedule import ExactSchedule


@dataclass
class Timeline:
    """What a schedule did, run to its end.

    Attributes:
        trace: one ``events.jsonl`` record per applied update, in order.
        versions: the last version made (version 1 is the initial model).
        sim_time: simulated time of the last applied update.
        failed: updates that counted nothing (failed devices).
        device_time: simulated time devices spent on applied tasks (selection to arrival), summed.
        devices_used: devices selected at least once.
        fleet: devices registered.
        version_times: the simulated time each version was made at (versions 2, 3, ...).
    """

    trace: list[dict] = field(default_factory=list)
    versions: int = 1
    sim_time: float = 0.0
    failed: int = 0
    device_time: float = 0.0
    devices_used: int = 0
    fleet: int = 0
    version_times: list[float] = field(default_factory=list)


def run_timeline(schedule: ExactSchedule, fleet: int) -> Timeline:
    """Start ``schedule`` (not yet started) and apply every update it releases, as a real run's server would;
    ``fleet``: the devices registered in its pool."""
    schedule.start()
    out = Timeline(fleet=fleet)
    while not schedule.done:
        due = schedule.next_due()
        arrival, _ = schedule.apply(due.device)
        out.trace.append(arrival.trace_record())
        out.device_time += due.arrival - due.selected_at
        out.failed += not arrival.counted
        if arrival.made_version:
            out.version_times.append(arrival.arrival)
    out.versions, out.sim_time, out.devices_used = schedule.version, schedule.now, len(schedule.task_counts)
    return out


def timeline_summary(timeline: Timeline) -> dict:
    """The figures a researcher plans with (``timeline.json``)."""
    t = timeline
    updates = len(t.trace)
    per_unit = Counter(math.floor(v) for v in t.version_times)
    units = math.floor(t.sim_time) + 1 if t.trace else 0
    taus = [r["tau"] for r in t.trace if not r.get("failed")]  # staleness of the updates that went into a model
    return {
        "versions": t.versions,
        "updates": updates,
        "sim_time": t.sim_time,
        "versions_per_time_unit": (t.versions - 1) / t.sim_time if t.sim_time > 0 else None,
        "versions_in_each_time_unit": [per_unit.get(u, 0) for u in range(units)],
        "staleness_histogram": dict(sorted(Counter(taus).items())),
        "staleness_mean": sum(taus) / len(taus) if taus else None,
        "failure_rate": t.failed / updates if updates else 0.0,
        "fleet": t.fleet,
        "devices_used": t.devices_used,
        # the mean share of the fleet training at a moment: device time over fleet x run time
        "fleet_utilisation": t.device_time / (t.fleet * t.sim_time) if t.fleet and t.sim_time > 0 else None,
    }


def write_timeline(timeline: Timeline, out_dir: str) -> dict:
    """``events.jsonl`` (as a real run writes it) and ``timeline.json`` (the summary) in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, EVENTS), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in timeline.trace)
    summary = timeline_summary(timeline)
    with open(os.path.join(out_dir, TIMELINE), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def format_timeline(summary: dict) -> str:
    """A few lines for the console."""
    s = summary
    rate = s["versions_per_time_unit"]
    util = s["fleet_utilisation"]
    return "\n".join(
        [
            f"[edgesim] dry run: {s['versions']} versions from {s['updates']} updates in {s['sim_time']:.3f} "
            f"simulated time units ({f'{rate:.3f} versions per unit' if rate is not None else 'no time passed'})",
            f"[edgesim] staleness: mean {s['staleness_mean'] if s['staleness_mean'] is None else round(s['staleness_mean'], 2)}, "
            f"max {max(s['staleness_histogram'], default=0)}; failure rate {s['failure_rate']:.3f}",
            f"[edgesim] fleet: {s['devices_used']} of {s['fleet']} devices used; on average "
            f"{'-' if util is None else f'{100 * util:.2f}%'} of the fleet training",
        ]
    )

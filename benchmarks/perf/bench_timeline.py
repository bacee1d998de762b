"""How fast the timing-only planner (``--dry-run``, ``scheduling.timeline``) computes a run's trace: FedBuff
(B = 2, min hole 1) with the paper's delays, ``--versions`` versions, K = ``--selection`` devices in flight, for
fleets of 10^4, 10^5 and 10^6 devices over two leaves, with every device always online and with a diurnal fleet
(``--availability diurnal``: one session a day of ``--online`` x ``--period`` time units; selection then draws
only online devices, and devices drop out). The goal: 10^6 devices and 10^5 versions in under a minute on 2 cores.

    python benchmarks/perf/bench_timeline.py --versions 100000 --selection 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dataclasses import replace  # noqa: E402

from common.delays import DELAY_PRESETS  # noqa: E402
from scheduling.event_reference import make_schedule  # noqa: E402
from scheduling.timeline import run_timeline, timeline_summary  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=100_000)
    parser.add_argument("--selection", type=int, default=1000)
    parser.add_argument("--fleets", default="10000,100000,1000000")
    parser.add_argument("--availability", default="always,diurnal", help="models to time, comma-separated")
    parser.add_argument("--period", type=float, default=24.0, help="the diurnal day, in time units")
    parser.add_argument("--online", type=float, default=0.5, help="the diurnal share of a day online")
    args = parser.parse_args()
    print(f"FedBuff B=2, K={args.selection}, paper delays, {args.versions} versions")
    print(
        f"{'devices':>9} {'availability':>12} {'seconds':>8} {'updates/s':>10} {'sim time':>9} {'mean tau':>9} "
        f"{'failed':>7} {'fleet used':>10}"
    )
    runs = [(int(n), a) for n in args.fleets.split(",") for a in args.availability.split(",")]
    for fleet, availability in runs:
        delays = replace(
            DELAY_PRESETS["paper"],
            availability=availability,
            availability_period=args.period,
            availability_online=args.online,
        )
        schedule = make_schedule(
            delays,
            0,
            {"site-1": fleet // 2, "site-2": fleet - fleet // 2},
            selection_size=args.selection,
            updates_per_version=2,
            min_hole_to_fill=1,
            max_model_version=args.versions,
        )
        started = time.perf_counter()
        timeline = run_timeline(schedule, fleet)
        seconds = time.perf_counter() - started
        s = timeline_summary(timeline)
        print(
            f"{fleet:>9} {availability:>12} {seconds:>8.1f} {s['updates'] / seconds:>10.0f} {s['sim_time']:>9.1f} "
            f"{s['staleness_mean']:>9.1f} {s['failure_rate']:>7.3f} {s['devices_used'] / fleet:>10.3f}"
        )


if __name__ == "__main__":
    main()

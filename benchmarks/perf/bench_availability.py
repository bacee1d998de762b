"""How a FedBuff result moves when the fleet comes and goes: the same seeded FedBuff run (``reproduce_fedrevive``'s
cpu scale: 200 devices, K = 20, the paper's delays, a budget of 40 simulated time units) with every device always
online, and on diurnal fleets (``--availability diurnal``: one session a day of ``online`` x ``--period`` units, at
each device's own seeded hour; a device whose session ends before its update arrives drops out).

One table: final and best accuracy, versions made, mean staleness of the updates that went into a model, the
failure rate, and the mean number of devices online as versions were made.

    python benchmarks/perf/bench_availability.py --online 1,0.5,0.25 --period 10 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.harness import run_job  # noqa: E402
from benchmarks.lib.scales import SCALES  # noqa: E402
from common.result_files import EVENTS, METRICS  # noqa: E402


def fleet_flags(online: float, period: float) -> list[str]:
    """``online`` 1: always online (the default model); below 1: a diurnal fleet online that share of a day."""
    if online >= 1:
        return ["--availability", "always"]
    return ["--availability", "diurnal", "--availability-period", str(period), "--availability-online", str(online)]


def summarise(out: str) -> dict:
    """The row of one finished run, from its ``metrics.json`` and ``events.jsonl``."""
    metrics = json.loads(Path(out, METRICS).read_text())
    events = [json.loads(line) for line in Path(out, EVENTS).read_text().splitlines()]
    counted = [e["tau"] for e in events if not e.get("failed")]
    online = [r["fleet"]["online"] for r in metrics["versions"] if r.get("fleet")]
    return {
        "final": metrics["summary"]["final_accuracy"],
        "best": metrics["summary"]["best_accuracy"],
        "versions": metrics["summary"]["last_version"],
        "tau": statistics.mean(counted) if counted else float("nan"),
        "failure_rate": metrics["summary"].get("failure_rate", 0.0),
        "online": statistics.mean(online) if online else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--online", default="1,0.5,0.25", help="shares of a day online; 1 = always")
    parser.add_argument("--period", type=float, default=10.0, help="the diurnal day, in simulated time units")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--budget", type=float, default=SCALES["cpu"]["budget"], help="simulated time units")
    parser.add_argument("--output", default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    root = args.output or tempfile.mkdtemp(prefix="bench_availability-")
    rows = []
    for online in (float(x) for x in args.online.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            out = os.path.join(root, f"online{online}-seed{seed}")
            flags = [
                *SCALES["cpu"]["flags"],
                "--method",
                "fedbuff",
                "--seed",
                str(seed),
                "--max-sim-time",
                str(args.budget),
                "--max-model-version",
                "100000",
                "--workspace",
                os.path.join(root, "ws"),
                *fleet_flags(online, args.period),
            ]
            print(f"[bench] FedBuff, online {online}, seed {seed} ...", flush=True)
            result = run_job("jobs/pt_job_fedrevive.py", flags, out)
            rows.append((online, seed, summarise(out), result.process_seconds))
    print(f"\nFedBuff, cpu scale, budget {args.budget} units, diurnal day {args.period} units; runs in {root}")
    print(
        f"{'online':>7} {'seed':>4} {'final acc':>9} {'best acc':>8} {'versions':>8} {'mean tau':>8} "
        f"{'failed':>7} {'online at versions':>18} {'wall s':>7}"
    )
    for online, seed, r, seconds in rows:
        label = "always" if online >= 1 else f"{online:g}"
        print(
            f"{label:>7} {seed:>4} {r['final']:>9.3f} {r['best']:>8.3f} {r['versions']:>8} {r['tau']:>8.1f} "
            f"{r['failure_rate']:>7.3f} {r['online']:>18.1f} {seconds:>7.0f}"
        )


if __name__ == "__main__":
    main()

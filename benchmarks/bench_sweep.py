"""A sweep's throughput on this machine: trials per hour, the machine's mean CPU busy while it ran, and each trial's
fixed cost (process start to its first evaluated version, plus its last version to the process's exit) against
its training time (first to last version).

It runs ``python -m jobs.sweep`` on a small learning-rate search over the hard synthetic data (a spec of its own,
or ``--spec``), samples the whole machine's CPU busy once a second, then reads the study and each trial's
``metrics.json``. Trials run as separate SimEnv jobs; there is no cheaper way yet to compare against.

    python benchmarks/bench_sweep.py [--trials 6] [--parallel 2] [--spec SPEC] [--read SWEEP_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import optuna  # noqa: E402
import psutil  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from common.result_files import METRICS  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = """
base: {{method: fedavg, num-leaf-nodes: 2, devices-per-leaf: 4, device-selection-size: 8, synthetic-size: 3000,
        subset-size: 300, synthetic-difficulty: 1, max-model-version: 6, delays: paper, seed: 3, workspace: {ws}}}
search: {{local-lr: {{type: log-float, low: 1.0e-7, high: 0.1}}}}
objective: {{metric: final_accuracy}}
trials: {trials}
"""


def fixed_costs(folder: str, trial: optuna.trial.FrozenTrial) -> tuple[float, float, float] | None:
    """(start-up, shut-down, training) seconds of one trial: process start to its first evaluated version, its last
    evaluated version to the process's exit, and the versions between."""
    try:
        with open(os.path.join(folder, trial.user_attrs["folder"], METRICS)) as f:
            records = json.load(f)["versions"]
    except (OSError, KeyError, ValueError):
        return None
    if not records or "started" not in trial.user_attrs:
        return None
    first, last = records[0]["epoch"], records[-1]["epoch"]
    return first - trial.user_attrs["started"], trial.user_attrs["ended"] - last, last - first


def report(folder: str, wall: float | None, busy: list[float]) -> None:
    storage = f"sqlite:///{os.path.join(folder, 'study.db')}"
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    ended = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    if wall is None:  # a sweep read again: from its first trial's start to its last trial's end
        wall = max(t.user_attrs["ended"] for t in ended) - min(t.user_attrs["started"] for t in ended)
    print(f"{len(ended)} trial(s) ended in {wall:.0f} s on {os.cpu_count()} cores ({folder})")
    print(f"trials per hour: {len(ended) * 3600 / wall:.0f}")
    if busy:
        print(f"mean CPU busy (the whole machine, other users included): {statistics.mean(busy):.0f}%")
    costs = [(t, c) for t in ended if (c := fixed_costs(folder, t))]
    for t, (up, down, train) in costs:
        share = (up + down) / (up + down + train)
        print(
            f"  trial {t.number} ({t.state.name.lower()}): start-up {up:.1f} s, shut-down {down:.1f} s, "
            f"training {train:.1f} s ({share:.0%} fixed)"
        )
    if costs:
        up, down, train = (statistics.mean(c[i] for _, c in costs) for i in range(3))
        print(
            f"mean fixed cost {up + down:.1f} s (start-up {up:.1f} s, shut-down {down:.1f} s) against {train:.1f} s "
            f"of training ({(up + down) / (up + down + train):.0%} fixed)"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--parallel", type=int, default=None, help="trials at once (default: the sweep's own plan)")
    p.add_argument("--spec", default=None, help="a spec of your own (default: the small search above)")
    p.add_argument("--read", default=None, metavar="DIR", help="report on a sweep's folder again, without running")
    args = p.parse_args()
    if args.read:
        report(args.read, None, [])
        return 0
    work = tempfile.mkdtemp(prefix="bench_sweep_")
    spec = args.spec or os.path.join(work, "bench.yaml")
    if not args.spec:
        with open(spec, "w") as f:
            f.write(SPEC.format(ws=os.path.join(work, "ws"), trials=args.trials))
    folder = os.path.join(work, "sweep")
    cmd = [sys.executable, "-m", "jobs.sweep", spec, "--output", folder, "--no-bar"]
    cmd += ["--parallel", str(args.parallel)] if args.parallel else []
    busy: list[float] = []
    done = threading.Event()

    def sample() -> None:
        psutil.cpu_percent(None)
        while not done.wait(1.0):
            busy.append(psutil.cpu_percent(None))

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.time()
    sampler.start()
    code = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL).returncode
    wall = time.time() - started
    done.set()
    sampler.join()
    print(f"sweep exit {code}")
    report(folder, wall, busy)
    return code


if __name__ == "__main__":
    sys.exit(main())

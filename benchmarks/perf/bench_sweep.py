"""A sweep's throughput on this machine: trials per hour, the machine's mean CPU busy while it ran, and each trial's
fixed cost (process start to its first evaluated version, plus its last version to the process's exit) against
its training time (first to last version), for each way of running trials, side by side from one run.

It runs ``python -m jobs.sweep`` on a small learning-rate search over the hard synthetic data (a spec of its own,
or ``--spec``), samples the whole machine's CPU busy once a second, then reads the study and each trial's
``metrics.json``. ``--ways``: ``simenv`` (each run a fresh SimEnv job: ``--pack 1``), ``deployment`` (each run a
job on one local deployment, ``python -m jobs.deploy up``, started here once: its start-up is printed apart, a cost
paid once per deployment, not per trial) and ``pack`` (runs sharing jobs, ``docs/sweeps.md``: with ``--seeds``, a
candidate's seeds as one job, the sweep's default; without, ``--pack N`` trials a job, default all of them).
``--seeds 0,1,2`` repeats each candidate over those seeds (``repeat: {seed: [...]}``). With both ``simenv`` and
``pack`` it prints their ratios. ``--scale cpu`` searches FedBuff's local learning rate at the cpu scale
(``benchmarks.lib.scales``, to its budget of simulated time) instead of the small FedAvg search: issue 59's
16-trial goal.

    python benchmarks/perf/bench_sweep.py [--trials 6] [--parallel 2] [--ways simenv,deployment] [--spec SPEC]
    python benchmarks/perf/bench_sweep.py --trials 2 --seeds 0,1,2 --ways simenv,pack
    python benchmarks/perf/bench_sweep.py --trials 16 --ways simenv,pack --scale cpu
    python benchmarks/perf/bench_sweep.py --trials 16 --ways pack,simenv --scale cpu --pack 4 --pack-queue 12
    python benchmarks/perf/bench_sweep.py --read SWEEP_DIR
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import optuna  # noqa: E402
import psutil  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from benchmarks.lib.scales import SCALES  # noqa: E402
from common.result_files import METRICS  # noqa: E402
from jobs.sweep.study import trial_runs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = """
base: {{method: fedavg, num-leaf-nodes: 2, devices-per-leaf: 4, device-selection-size: 8, synthetic-size: 3000,
        subset-size: 300, synthetic-difficulty: 1, max-model-version: 6, delays: paper, seed: 3, workspace: {ws}}}
search: {{local-lr: {{type: log-float, low: 1.0e-7, high: 0.1}}}}
objective: {{metric: final_accuracy}}
trials: {trials}
"""
CPU_SPEC = """
base: {{method: fedbuff, {flags}, max-sim-time: {budget}, max-model-version: 100000, seed: 3, workspace: {ws}}}
search: {{local-lr: {{type: log-float, low: 1.0e-4, high: 0.1}}}}
objective: {{metric: final_accuracy}}
trials: {trials}
"""
"""``--scale cpu``: FedBuff at the cpu scale (``SCALES["cpu"]``), its local learning rate searched."""
WAYS = ("simenv", "deployment", "pack")


def cpu_flags() -> str:
    """The cpu scale's flags as a spec's base entries (``name: value``), but the searched ``local-lr``."""
    words, entries = SCALES["cpu"]["flags"], []
    for i, word in enumerate(words):
        if word.startswith("--") and word != "--local-lr":
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "true"
            entries.append(f"{word[2:]}: {value}")
    return ", ".join(entries)


def spec_text(ws: str, trials: int, seeds: str | None, scale: str = "small") -> str:
    """The default spec (``scale`` small, or the cpu scale's FedBuff); with ``seeds``, each candidate repeated over
    them instead of the base's seed."""
    if scale == "cpu":
        text = CPU_SPEC.format(ws=ws, trials=trials, flags=cpu_flags(), budget=SCALES["cpu"]["budget"])
    else:
        text = SPEC.format(ws=ws, trials=trials)
    if seeds:
        text = text.replace(" seed: 3,", "") + f"repeat: {{seed: [{seeds}]}}\n"
    return text


def fixed_costs(folder: str, run: dict) -> tuple[float, float, float] | None:
    """(start-up, shut-down, training) seconds of one trial's process (``jobs.sweep.study.trial_runs``): its start
    to its first evaluated version, its last evaluated version to its exit, and the versions between."""
    try:
        with open(os.path.join(folder, run["folder"], METRICS)) as f:
            records = json.load(f)["versions"]
    except (OSError, KeyError, ValueError):
        return None
    if not records or "started" not in run:
        return None
    first, last = records[0]["epoch"], records[-1]["epoch"]
    return first - run["started"], run["ended"] - last, last - first


def job_costs(folder: str, runs: list[dict]) -> list[tuple[float, float, float]]:
    """(start-up, shut-down, wall) seconds of each job: runs that shared a process (a pack: the same ``started``)
    count once, from the process's start to the first version any of its runs evaluated, and from the last
    version any evaluated to the process's exit."""
    jobs: dict[float, list[dict]] = {}
    for run in runs:
        jobs.setdefault(run["started"], []).append(run)
    found = []
    for started, members in jobs.items():
        epochs = []
        for run in members:
            try:
                with open(os.path.join(folder, run["folder"], METRICS)) as f:
                    epochs += [r["epoch"] for r in json.load(f)["versions"]]
            except (OSError, KeyError, ValueError):
                continue
        if epochs:
            ended = max(r["ended"] for r in members)
            found.append((min(epochs) - started, ended - max(epochs), ended - started))
    return found


def report(folder: str, wall: float | None, busy: list[float], way: str = "") -> dict:
    """Print a sweep's figures; returns them (trials per hour, CPU busy, mean start-up, shut-down, training)."""
    if not os.path.exists(os.path.join(folder, "study.db")):
        print(f"{way}: no study ({folder})")
        return {}
    storage = f"sqlite:///{os.path.join(folder, 'study.db')}"
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    ended = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    runs = [(t, r) for t in ended for r in trial_runs(t) if "started" in r]
    if not runs:
        print(f"{way}: no trial ended ({folder})")
        return {}
    if wall is None:  # a sweep read again: from its first trial's start to its last trial's end
        wall = max(r["ended"] for _, r in runs) - min(r["started"] for _, r in runs)
    out = {"trials": len(ended), "wall": wall, "per_hour": len(ended) * 3600 / wall}
    print(
        f"{way + ': ' if way else ''}{len(ended)} trial(s) ended in {wall:.0f} s on {os.cpu_count()} cores ({folder})"
    )
    print(f"  trials per hour: {out['per_hour']:.0f}")
    if busy:
        out["busy"] = statistics.mean(busy)
        print(f"  mean CPU busy (the whole machine, other users included): {out['busy']:.0f}%")
    costs = [(t, c) for t, r in runs if (c := fixed_costs(folder, r))]
    for t, (up, down, train) in costs:
        share = (up + down) / (up + down + train)
        print(
            f"  trial {t.number} ({t.state.name.lower()}): start-up {up:.1f} s, shut-down {down:.1f} s, "
            f"training {train:.1f} s ({share:.0%} fixed)"
        )
    jobs = job_costs(folder, [r for _, r in runs])
    if jobs:
        up, down = sum(j[0] for j in jobs), sum(j[1] for j in jobs)
        spent = sum(j[2] for j in jobs)
        out["job_fixed"] = (up + down) / spent
        print(
            f"  per job ({len(jobs)} job(s) for {len(runs)} run(s)): start-up {up / len(jobs):.1f} s, shut-down "
            f"{down / len(jobs):.1f} s, of {spent / len(jobs):.1f} s a job ({out['job_fixed']:.0%} of the jobs' time fixed)"
        )
    if costs:
        up, down, train = (statistics.mean(c[i] for _, c in costs) for i in range(3))
        out |= {"up": up, "down": down, "train": train, "fixed": (up + down) / (up + down + train)}
        print(
            f"  mean fixed cost {up + down:.1f} s (start-up {up:.1f} s, shut-down {down:.1f} s) against {train:.1f} s "
            f"of training ({out['fixed']:.0%} fixed)"
        )
    return out


def run_sweep(spec: str, folder: str, parallel: int | None, extra: list[str]) -> tuple[float, list[float], int]:
    """Run one sweep while sampling the machine's CPU busy once a second: (wall seconds, samples, exit code)."""
    cmd = [sys.executable, "-m", "jobs.sweep", spec, "--output", folder, "--no-bar", *extra]
    cmd += ["--parallel", str(parallel)] if parallel else []
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
    return wall, busy, code


def leaves_of(spec: str) -> int:
    import yaml

    with open(spec) as f:
        return int((yaml.safe_load(f).get("base") or {}).get("num-leaf-nodes", 2))


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--parallel", type=int, default=None, help="trials at once (default: the sweep's own plan)")
    p.add_argument("--ways", default="simenv,deployment", help="simenv, deployment, pack (comma-separated)")
    p.add_argument("--seeds", default=None, help="repeat each candidate over these seeds (0,1,2): what pack packs")
    p.add_argument("--spec", default=None, help="a spec of your own (default: the small search above)")
    p.add_argument("--scale", choices=("small", "cpu"), default="small", help="the default spec's scale")
    p.add_argument("--pack", type=int, default=None, help="way pack without --seeds: trials a job (default: all)")
    p.add_argument("--pack-queue", type=int, default=None, help="way pack: the sweep's --pack-queue (its default: N)")
    p.add_argument("--pruner", default=None, help="the sweeps' --pruner (default: the sweep's own)")
    p.add_argument("--read", default=None, metavar="DIR", help="report on a sweep's folder again, without running")
    args = p.parse_args()
    if args.read:
        report(args.read, None, [])
        return 0
    ways = [w for w in args.ways.split(",") if w]
    if set(ways) - set(WAYS):
        p.error(f"--ways {args.ways}: any of {', '.join(WAYS)}")
    if args.seeds and args.spec:
        p.error("--seeds repeats the default spec's candidates; give a spec of your own its repeat: instead")
    work = tempfile.mkdtemp(prefix="bench_sweep_")
    spec = args.spec or os.path.join(work, "bench.yaml")
    if not args.spec:
        with open(spec, "w") as f:
            f.write(spec_text(os.path.join(work, "ws"), args.trials, args.seeds, args.scale))
    figures, code = {}, 0
    for way in ways:
        extra: list[str] = ["--pack", "1"]
        if way == "pack":  # a candidate's seeds: the sweep's default; trials: --pack N of them a job
            extra = [] if args.seeds else ["--pack", str(args.pack or args.trials)]
            extra += ["--pack-queue", str(args.pack_queue)] if args.pack_queue is not None else []
        if way == "deployment":  # one local deployment for the whole study: its start-up is paid once
            deployment = os.path.join(work, "deployment")
            up = [sys.executable, "-m", "jobs.deploy", "up", deployment, "--relays", "1", "--leaves"]
            started = time.time()
            if subprocess.run([*up, str(leaves_of(spec))], cwd=REPO, stdout=subprocess.DEVNULL).returncode != 0:
                print("deployment: python -m jobs.deploy up failed")
                continue
            print(f"deployment: up in {time.time() - started:.0f} s (once, for every trial)")
            extra += ["--deployment", deployment]
        try:
            extra += ["--pruner", args.pruner] if args.pruner else []
            wall, busy, exit_code = run_sweep(spec, os.path.join(work, f"sweep-{way}"), args.parallel, extra)
        finally:
            if way == "deployment":
                subprocess.run([sys.executable, "-m", "jobs.deploy", "down", deployment], cwd=REPO)
        print(f"{way}: sweep exit {exit_code}")
        code = code or exit_code
        figures[way] = report(os.path.join(work, f"sweep-{way}"), wall, busy, way)
    if {"simenv", "deployment"} <= set(figures) and all(figures.values()):
        a, b = figures["simenv"], figures["deployment"]
        print(
            f"deployment vs simenv: trials per hour x{b['per_hour'] / a['per_hour']:.2f}, fixed cost per trial "
            f"{b['up'] + b['down']:.1f} s vs {a['up'] + a['down']:.1f} s (x{(b['up'] + b['down']) / (a['up'] + a['down']):.2f}), "
            f"fixed share {b['fixed']:.0%} vs {a['fixed']:.0%}"
        )
    if {"simenv", "pack"} <= set(figures) and all(figures[w] for w in ("simenv", "pack")):
        a, b = figures["simenv"], figures["pack"]
        print(
            f"pack / simenv: wall {b['wall'] / a['wall']:.2f}x, trials per hour x{b['per_hour'] / a['per_hour']:.2f}, "
            f"fixed share of the jobs' time {b['job_fixed']:.0%} vs {a['job_fixed']:.0%}"
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
